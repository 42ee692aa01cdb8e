"""How the worker reads a broker's cancel and a consumer timeout off aiormq (amqp.consumers)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from aiormq.channel import exception_by_code
from pamqp import commands

from rmqdelay.amqp.consumers import (
    broker_version,
    consuming,
    is_consumer_timeout,
    on_broker_cancel,
)

TIMED_OUT = (
    "PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value "
    "used: 2000 ms. This timeout value can be configured, see consumers doc guide to learn more"
)


def test_a_channel_closed_for_a_late_ack_is_a_consumer_timeout_and_nothing_else() -> None:
    # as aiormq raises it for the broker's Channel.Close (406)
    timed_out = exception_by_code(commands.Channel.Close(reply_code=406, reply_text=TIMED_OUT))
    assert is_consumer_timeout(timed_out)
    other = commands.Channel.Close(reply_code=406, reply_text="PRECONDITION_FAILED - inequivalent")
    assert not is_consumer_timeout(exception_by_code(other))
    assert not is_consumer_timeout(ConnectionResetError(TIMED_OUT))
    assert not is_consumer_timeout(None)


def test_a_consumer_is_gone_when_its_tag_left_the_channel() -> None:
    channel = SimpleNamespace(consumers={"ctag1.a": object()})
    assert consuming(channel, "ctag1.a")
    assert not consuming(channel, "ctag1.b")
    assert consuming(object(), "anything")  # cannot tell: never called cancelled


def test_the_cancel_callback_where_aiormq_has_one() -> None:
    seen: list[str] = []
    callbacks: set[Any] = set()
    assert on_broker_cancel(
        SimpleNamespace(on_consumer_cancel_callbacks=callbacks), lambda: seen.append("x")
    )
    for callback in callbacks:
        callback(commands.Basic.Cancel(consumer_tag="ctag1.a"))
    assert seen == ["x"]
    assert not on_broker_cancel(SimpleNamespace(consumers={}), lambda: None)  # aiormq 6.8


def test_the_broker_version_from_the_server_properties() -> None:
    def connection(version: object) -> Any:
        props = {"version": version} if version is not None else {}
        return SimpleNamespace(
            transport=SimpleNamespace(connection=SimpleNamespace(server_properties=props))
        )

    assert broker_version(connection("4.3.6")) == (4, 3, 6)
    assert broker_version(connection(b"3.10.8")) == (3, 10, 8)
    assert broker_version(connection(None)) is None
    assert broker_version(cast(Any, SimpleNamespace(transport=None))) is None
