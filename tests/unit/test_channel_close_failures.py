"""A channel closed on a missing exchange (404) fails as unroutable only the message sent
to that exchange; the others it held may have been delivered: their fate is unknown."""

from __future__ import annotations

import aiormq
import pika.exceptions

from rmqdelay import Settings
from rmqdelay.amqp.aio_publisher import AsyncPublisher
from rmqdelay.amqp.pika_confirms import _failed
from rmqdelay.core.publishing.outgoing import Outgoing
from rmqdelay.core.publishing.publisher import PublisherCore
from rmqdelay.errors import PublisherClosedError, UnroutableError

SETTINGS = Settings(max_delay="1h")
CORE = PublisherCore(SETTINGS.layout)


def _outs() -> tuple[Outgoing, Outgoing]:
    missing = CORE.finalize(CORE.prepare("orders", b"a", delay="1s", message_id="missing"))
    other = CORE.finalize(CORE.prepare("orders", b"b", delay="2s", message_id="other"))
    assert missing.exchange != other.exchange
    return missing, other


def _detail(exchange: str) -> str:
    return f"NOT_FOUND - no exchange '{exchange}' in vhost '/'"


def test_the_sync_publisher_blames_only_the_message_that_named_the_exchange() -> None:
    missing, other = _outs()
    closed = pika.exceptions.ChannelClosedByBroker(404, _detail(missing.exchange))
    blamed = _failed(CORE, missing, closed, 5.0)
    unknown = _failed(CORE, other, closed, 5.0)
    assert isinstance(blamed, UnroutableError) and "missing" in str(blamed)
    assert isinstance(unknown, PublisherClosedError) and "may or may not" in str(unknown)
    assert "other" in str(unknown)


def test_the_async_publisher_blames_only_the_message_that_named_the_exchange() -> None:
    missing, other = _outs()
    publisher = AsyncPublisher(SETTINGS)
    closed = aiormq.exceptions.ChannelNotFoundEntity(_detail(missing.exchange))
    blamed = publisher._failure(missing, closed)
    unknown = publisher._failure(other, closed)
    assert isinstance(blamed, UnroutableError) and "missing" in str(blamed)
    assert isinstance(unknown, PublisherClosedError) and "may or may not" in str(unknown)
