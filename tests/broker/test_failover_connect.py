"""With several addresses, a client skips a dead one and connects to the next (with none
alive: tests/unit/test_connect_addresses.py)."""

from __future__ import annotations

from rmqdelay import Settings
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
