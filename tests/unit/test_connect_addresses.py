"""Several broker addresses with none alive: the error names each, masked. Its broker-side
half (a dead address skipped for a live one) is tests/broker/test_failover_connect.py."""

from __future__ import annotations

import pytest

from rmqdelay import ConnectionFailedError, Settings
from rmqdelay.amqp.connections import connect_async

DEAD = "amqp://guest:guest@127.0.0.1:1/%2F"  # nothing listens on port 1


async def test_all_dead_names_every_address_masked() -> None:
    other = "amqp://guest:s3cret-x@127.0.0.1:2/%2F"
    with pytest.raises(ConnectionFailedError) as info:
        await connect_async(Settings(url=[DEAD, other]), "test")
    assert "127.0.0.1:1" in str(info.value) and "127.0.0.1:2" in str(info.value)
    assert "s3cret-x" not in str(info.value)
