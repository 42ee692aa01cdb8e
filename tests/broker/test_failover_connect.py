"""With several addresses, a client skips a dead one and connects to the next."""

from __future__ import annotations

import pytest

from rmqdelay import ConnectionFailedError, Settings
from rmqdelay.amqp.connections import connect_async, connect_blocking

DEAD = "amqp://guest:guest@127.0.0.1:1/%2F"  # nothing listens on port 1


def test_the_sync_client_moves_past_a_dead_address(amqp_url: str) -> None:
    connection = connect_blocking(Settings(url=[DEAD, str(amqp_url)]), "test")
    try:
        assert connection.is_open
    finally:
        connection.close()


async def test_the_async_client_moves_past_a_dead_address(amqp_url: str) -> None:
    connection = await connect_async(Settings(url=[DEAD, str(amqp_url)]), "test")
    try:
        assert not connection.is_closed
    finally:
        await connection.close()


async def test_all_dead_names_every_address_masked() -> None:
    other = "amqp://guest:s3cret-x@127.0.0.1:2/%2F"
    with pytest.raises(ConnectionFailedError) as info:
        await connect_async(Settings(url=[DEAD, other]), "test")
    assert "127.0.0.1:1" in str(info.value) and "127.0.0.1:2" in str(info.value)
    assert "s3cret-x" not in str(info.value)
