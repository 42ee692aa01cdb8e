"""aiormq's private books are used only where their self-checks pass, and are otherwise
left for the public ``basic_publish`` (rmqdelay/amqp/aiormq_private/)."""

from __future__ import annotations

import asyncio
import functools
import importlib
import logging
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiormq
import pytest
from pamqp.commands import Basic

from rmqdelay import Settings
from rmqdelay.amqp import aiormq_private
from rmqdelay.core.publishing.publisher import PublisherCore
from rmqdelay.core.wire import encode_publish

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

ROOT = Path(__file__).resolve().parents[2]
CORE = PublisherCore(Settings(max_delay="1h").layout)


def _bounds(name: str) -> tuple[str, str]:
    """The lower and upper bound pyproject.toml declares for ``name``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        found = re.fullmatch(rf"{name}\s*>=\s*([\d.]+)\s*,\s*<\s*([\d.]+)", line.split(";")[0])
        if found:
            return found[1], found[2]
    raise AssertionError(f"pyproject.toml declares no '{name}>=x,<y'")


def test_the_self_check_knows_the_declared_versions() -> None:
    declared = tuple(tuple(int(p) for p in end.split(".")) for end in _bounds("aiormq"))
    assert declared == aiormq_private.AIORMQ_BOUNDS
    assert aiormq_private.PROBLEM == "", "the installed aiormq should pass its self-check"


@pytest.mark.parametrize("version", ["6.7.7", "8.0.0", "9.1", "5.2.2"])
def test_the_self_check_refuses_a_version_outside_the_bounds(version: str) -> None:
    assert "outside the versions" in aiormq_private.self_check(version)


@pytest.mark.parametrize("version", ["6.8.0", "6.9.4", "7.2.4", "7.99.1.post1"])
def test_the_self_check_accepts_a_version_inside_the_bounds(version: str) -> None:
    assert aiormq_private.self_check(version) == ""


def test_the_self_check_refuses_a_channel_or_frame_it_does_not_know() -> None:
    class Channel:
        def basic_publish(self) -> None: ...

    @dataclass
    class Frame:
        data: bytes

    assert "no create_future()" in aiormq_private.self_check("7.2.4", channel=Channel)
    assert "no payload" in aiormq_private.self_check("7.2.4", frame=Frame)
    assert "no longer a dataclass" in aiormq_private.self_check("7.2.4", frame=SimpleNamespace)


@pytest.fixture
def reimported(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Import the module again after the test's changes, and once more after undoing them."""
    yield
    monkeypatch.undo()
    importlib.reload(aiormq_private)
    assert aiormq_private.PROBLEM == ""


def test_an_aiormq_outside_the_bounds_turns_the_books_off_at_import(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, reimported: None
) -> None:
    real = metadata.version
    monkeypatch.setattr(
        metadata, "version", lambda name: "8.0.0" if name == "aiormq" else real(name)
    )
    with caplog.at_level(logging.WARNING, "rmqdelay.publisher"):
        importlib.reload(aiormq_private)
    assert "aiormq 8.0.0 is outside" in aiormq_private.PROBLEM
    assert "through basic_publish" in caplog.text
    assert not aiormq_private.can_write_frames(_channel())


def _channel(**changes: Any) -> Any:
    """What can_write_frames and write_window use of an aiormq channel, nothing else."""
    books: dict[str, Any] = {
        "publisher_confirms": True,
        "confirmations": {},
        "message_id_delivery_tag": {},
        "delivery_tag": 0,
        "write_queue": asyncio.Queue(),
        "lock": asyncio.Lock(),
        "is_closed": False,
        "number": 3,
        "connection": SimpleNamespace(connection_tune=SimpleNamespace(frame_max=4096)),
        "create_future": lambda: asyncio.get_running_loop().create_future(),
    }
    books.update(changes)
    channel: Any = SimpleNamespace(**{k: v for k, v in books.items() if v is not _GONE})
    # aiormq's own confirm handling, run on these books
    channel._confirm_delivery = functools.partial(aiormq.Channel._confirm_delivery, channel)
    channel._on_confirm_frame = functools.partial(aiormq.Channel._on_confirm_frame, channel)
    return channel


_GONE = object()


def test_the_books_are_used_on_a_confirm_channel_that_keeps_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RMQDELAY_CLIENT_FAST", raising=False)
    assert aiormq_private.can_write_frames(_channel())
    assert not aiormq_private.can_write_frames(_channel(publisher_confirms=False))


@pytest.mark.parametrize("value", ["0", "false", "off", "No"])
def test_client_fast_0_forces_basic_publish(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("RMQDELAY_CLIENT_FAST", value)
    assert not aiormq_private.can_write_frames(_channel())


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"confirmations": _GONE}, "has no confirmations"),
        ({"write_queue": _GONE, "lock": _GONE}, "has no write_queue, lock"),
        ({"delivery_tag": "7"}, "keeps other books"),
        ({"connection": SimpleNamespace()}, "keeps other books"),
    ],
)
def test_a_channel_keeping_other_books_goes_through_basic_publish(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    changes: dict[str, Any],
    problem: str,
) -> None:
    monkeypatch.delenv("RMQDELAY_CLIENT_FAST", raising=False)
    monkeypatch.setattr(aiormq_private, "_warned", set())
    with caplog.at_level(logging.WARNING, "rmqdelay.publisher"):
        assert not aiormq_private.can_write_frames(_channel(**changes))
        assert not aiormq_private.can_write_frames(_channel(**changes))
    assert caplog.text.count(problem) == 1, "one warning per kind of problem"


def _messages(*ids: str) -> list[Any]:
    return [
        CORE.prepare("orders", f"{m}".encode(), delay=i, message_id=m) for i, m in enumerate(ids)
    ]


async def _write(channel: Any, book: Any, *ids: str) -> bool:
    return await aiormq_private.write_window(channel, book, _messages(*ids), CORE.route)


def _aiormq_confirms(channel: Any) -> Any:
    """The channel's confirm frame handler, as aiormq's reader calls it."""
    channel.loop = asyncio.get_running_loop()

    async def on_frame(frame: Any) -> None:
        await channel._on_confirm_frame(frame)
        for _ in range(3):  # aiormq settles a multiple ack in call_soon callbacks
            await asyncio.sleep(0)

    return on_frame


async def test_a_window_is_one_write_with_a_slot_per_message_in_the_books() -> None:
    channel = _channel(delivery_tag=4)
    book = aiormq_private.Confirms(channel)
    messages = _messages("m0", "m1", "m2")
    assert await aiormq_private.write_window(channel, book, messages, CORE.route)
    frame = channel.write_queue.get_nowait()
    assert channel.write_queue.empty()
    # each slot keeps its message and the route it went with: the same plan again
    assert [s.message for s in book.slots] == messages
    outs = [CORE.finalize(s.message, s.route.planned_at_us) for s in book.slots]
    assert [(o.exchange, o.routing_key, o.plan.routing_key) for o in outs] == [
        s.route[:3] for s in book.slots
    ]
    assert frame.payload == b"".join(
        encode_publish(
            3,
            o.exchange,
            o.routing_key,
            o.prepared.encoded_properties,
            o.prepared.body,
            frame_max=4096,
        )
        for o in outs
    )
    assert channel.delivery_tag == 7
    assert channel.confirmations == dict(zip([5, 6, 7], book.slots, strict=True))
    assert channel.message_id_delivery_tag == {"m0": 5, "m1": 6, "m2": 7}
    assert book.outstanding == 3
    on_frame = _aiormq_confirms(channel)
    await on_frame(Basic.Ack(delivery_tag=6))
    assert channel.message_id_delivery_tag == {"m0": 5, "m2": 7}
    assert [s.value for s in book.slots] == [None, True, None] and book.outstanding == 2


async def test_a_multiple_ack_and_a_nack_reach_each_slot_and_wake_the_window() -> None:
    channel = _channel()
    on_frame = _aiormq_confirms(channel)
    book = aiormq_private.Confirms(channel)
    await _write(channel, book, "a", "b", "c")
    await _write(channel, book, "d", "e")
    waiting = asyncio.ensure_future(book.wait(2, timeout=3600))
    await on_frame(Basic.Ack(delivery_tag=2, multiple=True))
    assert not waiting.done(), "3 still wait: more than 2"
    await on_frame(Basic.Nack(delivery_tag=4))
    assert waiting.done() and waiting.result() is True
    values = [s.value for s in book.slots]
    assert values[:2] == [True, True] and values[2] is None and values[4] is None
    assert isinstance(values[3], aiormq.exceptions.DeliveryError)
    assert channel.message_id_delivery_tag == {"c": 3, "e": 5}
    assert list(channel.confirmations) == [3, 5]


async def test_what_waits_past_the_timeout_is_dropped_and_a_late_confirm_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    channel = _channel()
    on_frame = _aiormq_confirms(channel)
    book = aiormq_private.Confirms(channel)
    await _write(channel, book, "a", "b")
    assert await book.wait(0, timeout=0) is False
    book.finish()
    assert [s.value for s in book.slots] == [aiormq_private.DROPPED] * 2
    assert channel.message_id_delivery_tag == {}
    with caplog.at_level(logging.DEBUG, "aiormq"):
        await on_frame(Basic.Ack(delivery_tag=2, multiple=True))
    assert [s.value for s in book.slots] == [aiormq_private.DROPPED] * 2
    assert channel.confirmations == {}
    # aiormq 7 passes over the late tags quietly; 6.8 (the oldest allowed) logs each
    # as ignored: a warning of its own, nothing more
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert all(r.getMessage().endswith("was ignored") for r in loud), caplog.text


async def test_a_closing_channel_ends_the_wait_with_its_reason() -> None:
    channel = _channel()
    store: list[asyncio.Future[Any]] = []
    loop = asyncio.get_running_loop()

    def create_future() -> asyncio.Future[Any]:
        store.append(loop.create_future())
        return store[-1]

    channel.create_future = create_future
    book = aiormq_private.Confirms(channel)
    await _write(channel, book, "a")
    waiting = asyncio.ensure_future(book.wait(0, timeout=3600))
    await asyncio.sleep(0)
    reason = aiormq.exceptions.ChannelClosed(404, "NOT_FOUND")
    store[0].set_exception(reason)  # as aiormq's reject_all does on a close
    assert await waiting is False
    assert book.closed is reason
    book.finish()
    assert book.slots[0].value is aiormq_private.DROPPED


async def test_nothing_is_written_to_a_channel_the_broker_is_closing() -> None:
    """aiormq answers the broker's Channel.Close before the channel's futures learn of
    it: a publish after that answer would close the whole connection."""
    reason = aiormq.exceptions.ChannelNotFoundEntity(404, "NOT_FOUND - no exchange 'x'")
    channel = _channel(_close_exception=reason)
    book = aiormq_private.Confirms(channel)
    assert not await _write(channel, book, "a")
    assert channel.write_queue.empty() and channel.confirmations == {}
    assert book.closed is reason and book.slots == [] and channel.delivery_tag == 0
    closing = asyncio.Event()
    closing.set()  # aiormq's own close event: its basic_ack refuses to write then too
    for closed in (_channel(is_closed=True), _channel(_Channel__close_event=closing)):
        book = aiormq_private.Confirms(closed)
        assert not await _write(closed, book, "a")
        assert closed.write_queue.empty() and closed.confirmations == {}
        assert isinstance(book.closed, aiormq.exceptions.ChannelInvalidStateError)


async def test_frames_queued_while_the_channel_closed_are_taken_back() -> None:
    channel = _channel(write_queue=asyncio.Queue(maxsize=1))
    channel.write_queue.put_nowait("earlier")
    book = aiormq_private.Confirms(channel)
    writing = asyncio.ensure_future(_write(channel, book, "a"))
    await asyncio.sleep(0)
    assert not writing.done(), "it waits for room in the write queue"
    channel._close_exception = reason = aiormq.exceptions.ChannelClosed(406, "PRECONDITION")
    assert channel.write_queue.get_nowait() == "earlier"
    assert await writing is False
    assert channel.write_queue.get_nowait().payload == b""
    assert book.closed is reason and book.slots == [] and channel.confirmations == {}


async def test_a_multiple_ack_is_settled_as_it_is_read() -> None:
    """No call_soon per message (aiormq's way): ``loop`` is not even there to use."""
    channel = _channel()
    book = aiormq_private.Confirms(channel)
    assert await _write(channel, book, "a", "b", "c")
    channel.loop = None
    await channel._on_confirm_frame(Basic.Ack(delivery_tag=2, multiple=True))
    assert [s.value for s in book.slots] == [True, True, None]
    assert list(channel.confirmations) == [3] and book.outstanding == 1
    installed = channel._on_confirm_frame
    aiormq_private.Confirms(channel)  # installed once per channel, not wrapped again
    assert channel._on_confirm_frame is installed
    await channel._on_confirm_frame(Basic.Ack(delivery_tag=3, multiple=True))
    assert [s.value for s in book.slots] == [True, True, True]


def test_frames_made_late_need_the_channel_frame_aiormq_writes() -> None:
    """The writer reads ``payload``, then ``should_drain`` and ``drain()``: a frame
    without them, or no dataclass, turns the made-late acks off (basic_ack instead)."""
    assert aiormq_private.LATE_PROBLEM == ""

    @dataclass(frozen=True)
    class NoDrain:
        payload: bytes
        should_close: bool

    class Plain:
        payload = b""

    assert "drain_future" in aiormq_private._frame_problem(NoDrain)
    assert "dataclass" in aiormq_private._frame_problem(Plain)


def test_frames_made_late_are_off_on_a_channel_without_a_write_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop_free = SimpleNamespace(write_queue=asyncio.Queue(), number=1, is_closed=False)
    loop_free.create_future = lambda: None
    assert aiormq_private.can_queue_made_late(loop_free)
    assert not aiormq_private.can_queue_made_late(SimpleNamespace(number=1, is_closed=False))
    monkeypatch.setattr(aiormq_private, "LATE_PROBLEM", "aiormq x.y")
    assert not aiormq_private.can_queue_made_late(loop_free)
