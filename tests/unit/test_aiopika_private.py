"""A delivery's aio-pika message, built without the per-attribute lock check, is the same
object as the public constructor's (rmqdelay/amqp/aiopika_private.py)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from aio_pika import IncomingMessage

from rmqdelay.amqp import aiopika_private


def test_the_installed_aio_pika_passes_the_self_check() -> None:
    assert aiopika_private.PROBLEM == ""
    assert aiopika_private.self_check() == ""


def test_a_built_message_equals_the_public_one_and_locks_as_it() -> None:
    delivered = aiopika_private._sample(
        message_id="id-1",
        headers={"rmqdelay-due-at": 5, "x": "y"},
        delivery_mode=2,
        timestamp=datetime(2026, 1, 2, tzinfo=timezone.utc),
        correlation_id="c",
    )
    built = aiopika_private.incoming_message()(delivered)
    public = IncomingMessage(delivered, no_ack=False)
    assert type(built) is IncomingMessage
    for name in aiopika_private._slots(IncomingMessage):
        assert getattr(built, name, None) == getattr(public, name, None), name
    assert (built.message_id, built.headers["x"], built.delivery_tag) == ("id-1", "y", 7)
    built.message_id = "unlocked: may change"
    built.lock()
    with pytest.raises(ValueError, match="locked"):
        built.message_id = "locked"


def test_client_fast_off_takes_the_public_constructor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RMQDELAY_CLIENT_FAST", "0")
    assert aiopika_private.incoming_message() is IncomingMessage
    monkeypatch.setenv("RMQDELAY_CLIENT_FAST", "1")
    assert aiopika_private.incoming_message() is aiopika_private._fast


def test_a_problem_takes_the_public_constructor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiopika_private, "PROBLEM", "a class this module does not know")
    assert aiopika_private.incoming_message() is IncomingMessage
