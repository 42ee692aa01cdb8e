"""Bad inputs to the Python API, sync and async: a typed error, in bounded time, nothing sent.

One table, run through both publishers against a real broker. After every case the work
queue, the first tiers and the schedule journal are checked: nothing reached the broker.
The CLI's bad inputs are in ``test_cli_errors.py`` (exit codes, one line, no password).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import pika
import pytest

from rmqdelay import (
    AsyncPublisher,
    DelayError,
    InvalidBodyError,
    InvalidDestinationError,
    InvalidMessageError,
    Publisher,
    RmqDelayError,
    Settings,
    UnknownDestinationError,
)
from tests.helpers.worker_helpers import SharedTopology

DEST = "bad-inputs"
BOUND_S = 10.0  # generous: the point is that nothing hangs
LONG = "x" * 256

# (id, destination, body, options, expected error type)
CASES: list[tuple[str, Any, Any, dict[str, Any], type[BaseException]]] = [
    ("newline-in-destination", "bad\n", b"x", {"delay": "5m"}, InvalidDestinationError),
    ("empty-destination", "", b"x", {"delay": "5m"}, InvalidDestinationError),
    ("space-in-destination", "a b", b"x", {"delay": "5m"}, InvalidDestinationError),
    ("trailing-dot-destination", "a.", b"x", {"delay": "5m"}, InvalidDestinationError),
    ("long-destination", "d" * 300, b"x", {"delay": "5m"}, InvalidDestinationError),
    ("nul-in-destination", "a\x00b", b"x", {"delay": "5m"}, InvalidDestinationError),
    ("unknown-destination", "nobody-here", b"x", {"delay": "5m"}, UnknownDestinationError),
    ("int-over-64-bits", DEST, b"x", {"delay": "5m", "headers": {"k": 2**70}}, InvalidMessageError),
    (
        "int-under-64-bits",
        DEST,
        b"x",
        {"delay": "5m", "headers": {"k": -(2**64)}},
        InvalidMessageError,
    ),
    ("object-header", DEST, b"x", {"delay": "5m", "headers": {"k": object()}}, InvalidMessageError),
    ("set-header", DEST, b"x", {"delay": "5m", "headers": {"k": {1, 2}}}, InvalidMessageError),
    (
        "nested-bad-header",
        DEST,
        b"x",
        {"delay": "5m", "headers": {"k": [{"a": object()}]}},
        InvalidMessageError,
    ),
    (
        "nan-header",
        DEST,
        b"x",
        {"delay": "5m", "headers": {"k": float("nan")}},
        InvalidMessageError,
    ),
    (
        "inf-header",
        DEST,
        b"x",
        {"delay": "5m", "headers": {"k": float("inf")}},
        InvalidMessageError,
    ),
    ("int-header-name", DEST, b"x", {"delay": "5m", "headers": {1: "v"}}, InvalidMessageError),
    ("long-header-name", DEST, b"x", {"delay": "5m", "headers": {LONG: "v"}}, InvalidMessageError),
    ("headers-not-a-dict", DEST, b"x", {"delay": "5m", "headers": "notadict"}, InvalidMessageError),
    ("headers-a-list", DEST, b"x", {"delay": "5m", "headers": [("k", "v")]}, InvalidMessageError),
    (
        "huge-headers",
        DEST,
        b"x",
        {"delay": "5m", "headers": {f"k{i}": "v" * 200 for i in range(800)}},
        InvalidMessageError,
    ),
    ("long-message-id", DEST, b"x", {"delay": "5m", "message_id": LONG}, InvalidMessageError),
    ("empty-message-id", DEST, b"x", {"delay": "5m", "message_id": ""}, InvalidMessageError),
    ("int-message-id", DEST, b"x", {"delay": "5m", "message_id": 7}, InvalidMessageError),
    (
        "long-correlation-id",
        DEST,
        b"x",
        {"delay": "5m", "correlation_id": LONG},
        InvalidMessageError,
    ),
    ("long-content-type", DEST, b"x", {"delay": "5m", "content_type": LONG}, InvalidMessageError),
    (
        "long-content-encoding",
        DEST,
        b"x",
        {"delay": "5m", "content_encoding": LONG},
        InvalidMessageError,
    ),
    ("long-type", DEST, b"x", {"delay": "5m", "type": LONG}, InvalidMessageError),
    ("long-app-id", DEST, b"x", {"delay": "5m", "app_id": LONG}, InvalidMessageError),
    ("long-reply-to", DEST, b"x", {"delay": "5m", "reply_to": LONG}, InvalidMessageError),
    ("int-reply-to", DEST, b"x", {"delay": "5m", "reply_to": 5}, InvalidMessageError),
    ("priority-256", DEST, b"x", {"delay": "5m", "priority": 256}, InvalidMessageError),
    ("priority-negative", DEST, b"x", {"delay": "5m", "priority": -1}, InvalidMessageError),
    ("priority-bool", DEST, b"x", {"delay": "5m", "priority": True}, InvalidMessageError),
    ("priority-str", DEST, b"x", {"delay": "5m", "priority": "high"}, InvalidMessageError),
    ("body-object", DEST, object(), {"delay": "5m"}, InvalidBodyError),
    ("body-set", DEST, {1, 2}, {"delay": "5m"}, InvalidBodyError),
    ("body-nan-json", DEST, {"v": float("nan")}, {"delay": "5m"}, InvalidBodyError),
    ("no-delay-no-at", DEST, b"x", {}, DelayError),
    ("delay-and-at", DEST, b"x", {"delay": "5m", "at": datetime.now().astimezone()}, DelayError),
    ("negative-delay", DEST, b"x", {"delay": -1}, DelayError),
    ("nan-delay", DEST, b"x", {"delay": float("nan")}, DelayError),
    ("inf-delay", DEST, b"x", {"delay": float("inf")}, DelayError),
    ("huge-delay", DEST, b"x", {"delay": 1e300}, DelayError),
    ("delay-over-max", DEST, b"x", {"delay": "2h"}, DelayError),
    ("unparsable-delay", DEST, b"x", {"delay": "soon"}, DelayError),
    ("naive-at", DEST, b"x", {"at": datetime.now()}, DelayError),
    ("at-not-a-datetime", DEST, b"x", {"at": "tomorrow"}, DelayError),
    ("timedelta-negative", DEST, b"x", {"delay": timedelta(seconds=-5)}, DelayError),
    (
        "decimal-header-too-precise",
        DEST,
        b"x",
        {"delay": "5m", "headers": {"d": Decimal("1e-300")}},
        InvalidMessageError,
    ),
]


def _nothing_reached_the_broker(settings: Settings) -> None:
    layout = settings.layout
    names = [layout.work_queue(DEST), *(t.queue for t in layout.tiers)]
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        counts = {n: channel.queue_declare(n, passive=True).method.message_count for n in names}
    finally:
        connection.close()
    assert {n: c for n, c in counts.items() if c} == {}


@pytest.fixture(scope="module")
def settings(module_topology: SharedTopology) -> Settings:
    return module_topology.settings([DEST], connection_name="bad-inputs")


@pytest.mark.parametrize(
    ("destination", "body", "options", "error"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_the_sync_publisher_refuses_before_sending(
    settings: Settings,
    destination: Any,
    body: Any,
    options: dict[str, Any],
    error: type[BaseException],
) -> None:
    with Publisher(settings) as publisher:
        started = time.monotonic()
        with pytest.raises(error) as info:
            publisher.publish(destination, body, **options)
        assert time.monotonic() - started < BOUND_S
    assert isinstance(info.value, RmqDelayError)
    _nothing_reached_the_broker(settings)


@pytest.mark.parametrize(
    ("destination", "body", "options", "error"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
async def test_the_async_publisher_refuses_alike(
    settings: Settings,
    destination: Any,
    body: Any,
    options: dict[str, Any],
    error: type[BaseException],
) -> None:
    async with AsyncPublisher(settings) as publisher:
        started = time.monotonic()
        with pytest.raises(error) as info:
            await publisher.publish(destination, body, **options)
        assert time.monotonic() - started < BOUND_S
    assert isinstance(info.value, RmqDelayError)
    _nothing_reached_the_broker(settings)


def test_the_table_has_at_least_45_kinds() -> None:
    assert len({case[0] for case in CASES}) >= 45
