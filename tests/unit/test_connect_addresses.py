"""Several broker addresses with none alive: the error names each, masked. Its broker-side
half (a dead address skipped for a live one) is tests/broker/test_failover_connect.py."""

from __future__ import annotations

import pytest

from rmqdelay import ConnectionFailedError, Settings
from rmqdelay.amqp.connections import candidate_urls, connect_async

DEAD = "amqp://guest:guest@127.0.0.1:1/%2F"  # nothing listens on port 1


async def test_all_dead_names_every_address_masked() -> None:
    other = "amqp://guest:s3cret-x@127.0.0.1:2/%2F"
    with pytest.raises(ConnectionFailedError) as info:
        await connect_async(Settings(url=[DEAD, other]), "test")
    assert "127.0.0.1:1" in str(info.value) and "127.0.0.1:2" in str(info.value)
    assert "s3cret-x" not in str(info.value)


def test_a_node_that_stopped_confirming_is_tried_last() -> None:
    a, b, c = (f"amqp://u:p@n{i}:5672/%2F" for i in (1, 2, 3))
    settings = Settings(url=f"{a},{b},{c}")
    assert candidate_urls(settings, last=[a]) == [b, c, a]
    assert candidate_urls(settings, last=[b]) == [a, c, b]
    assert candidate_urls(settings) == [a, b, c]
    shuffled = Settings(url=f"{a},{b},{c}", url_order="shuffled")
    for _ in range(20):
        assert candidate_urls(shuffled, last=[c])[-1] == c
