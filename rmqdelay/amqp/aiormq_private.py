"""Every reach into aiormq's private state, in one place: the async publisher's windows,
the worker's deliveries without a task of aiormq's each (:func:`deliver_at_once`), and
its acks made when aiormq's writer takes them (:func:`queue_made_late`).

:func:`write_window` sends messages as one write of frames rmqdelay encoded, with a
slot per message in the channel's own books (``confirmations``,
``message_id_delivery_tag``, ``delivery_tag``, under its ``lock``, written to the
connection's ``write_queue``), so returns, nacks and a closing channel reach each message
as they reach ``aiormq.Channel.basic_publish``'s own. A slot is not a future: it has
only what aiormq's ``_confirm_delivery`` and ``_on_return_frame`` call on one
(:class:`_Slot`), and :class:`Confirms` keeps a sliding window over the slots of a
batch. None of that is aiormq's public API, so it is checked: when this module is
imported (the aiormq version inside the bounds pyproject.toml declares, what the classes
show) and on each channel before use. When a check fails, or ``RMQDELAY_CLIENT_FAST=0``
asks for it, each message goes through the public ``basic_publish`` instead: slower,
the same outcomes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import aiormq
from aiormq.abc import ChannelFrame

from ..core.plan import Route
from ..core.publishing.outgoing import Prepared
from ..core.wire import encode_publish
from .publishing import client_fast

__all__ = [
    "AIORMQ_BOUNDS",
    "AT_ONCE",
    "DROPPED",
    "PROBLEM",
    "Confirms",
    "can_queue_made_late",
    "can_write_frames",
    "deliver_at_once",
    "queue_made_late",
    "self_check",
    "write_window",
]

log = logging.getLogger("rmqdelay.publisher")
_consumer_log = logging.getLogger("rmqdelay.worker")

AIORMQ_BOUNDS = ((6, 8), (8,))
"""The aiormq versions whose books this module knows: >= 6.8, < 8 (as pyproject.toml)."""

_BOOKS = (
    "confirmations",
    "message_id_delivery_tag",
    "delivery_tag",
    "write_queue",
    "lock",
    "is_closed",
)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def self_check(version: str, channel: type = aiormq.Channel, frame: type = ChannelFrame) -> str:
    """What stops :func:`write_window` on this aiormq: empty when nothing does.

    The books themselves are set in ``Channel.__init__``: :func:`can_write_frames` checks
    them on each channel; this checks what the classes show.
    """
    low, high = AIORMQ_BOUNDS
    if not low <= _version(version) < high:
        return f"aiormq {version} is outside the versions rmqdelay knows (>= 6.8, < 8)"
    for name in (
        "basic_publish",
        "create_future",
        "_confirm_delivery",
        "_on_confirm_frame",
        "_on_return_frame",
    ):
        if not callable(getattr(channel, name, None)):
            return f"aiormq.Channel has no {name}()"
    if not dataclasses.is_dataclass(frame):
        return "aiormq.abc.ChannelFrame is no longer a dataclass"
    fields = {field.name for field in dataclasses.fields(frame)}
    if not {"payload", "should_close"} <= fields:
        return "aiormq.abc.ChannelFrame has no payload or should_close"
    return ""


PROBLEM = self_check(metadata.version("aiormq"))
"""Why :func:`write_window` is off for this process, or empty."""
if PROBLEM:
    log.warning("%s: publishing message by message through basic_publish", PROBLEM)

_warned: set[str] = set()


def _books_problem(underlay: Any) -> str:
    missing = [name for name in _BOOKS if not hasattr(underlay, name)]
    if missing:
        return f"aiormq {metadata.version('aiormq')}'s channel has no {', '.join(missing)}"
    kinds = (
        (underlay.confirmations, dict),
        (underlay.message_id_delivery_tag, dict),
        (underlay.delivery_tag, int),
        (getattr(underlay, "number", None), int),
        (getattr(getattr(underlay.connection, "connection_tune", None), "frame_max", None), int),
    )
    if not all(isinstance(value, kind) for value, kind in kinds):
        return f"aiormq {metadata.version('aiormq')}'s channel keeps other books"
    return ""


def can_write_frames(underlay: Any) -> bool:
    """Whether :func:`write_window` may run on this channel (a confirm channel whose
    books look as expected); otherwise each message goes through ``basic_publish``."""
    if PROBLEM or not client_fast() or not getattr(underlay, "publisher_confirms", False):
        return False
    problem = _books_problem(underlay)
    if problem and problem not in _warned:
        _warned.add(problem)
        log.warning("%s: publishing message by message through basic_publish", problem)
    return not problem


def _confirm_at_once(underlay: Any) -> None:
    """Settle a multiple ack's messages as the frame is read, on this channel.

    aiormq schedules a ``call_soon`` per message a multiple ack covers (a handle and a
    context each: a fifth of the client CPU of a batch, and garbage). This calls its own
    ``_confirm_delivery`` for each, in tag order, at once; anything else (a single ack,
    a nack, a tag it does not know) goes to aiormq's ``_on_confirm_frame`` as before.
    """
    original = underlay._on_confirm_frame
    if getattr(original, "rmqdelay", False):
        return
    confirm = underlay._confirm_delivery

    async def on_confirm_frame(frame: Any) -> None:
        confirmations = underlay.confirmations
        last = frame.delivery_tag
        if not getattr(frame, "multiple", False) or last not in confirmations:
            await original(frame)
            return
        for tag in [tag for tag in confirmations if tag <= last]:
            confirm(tag, frame)

    on_confirm_frame.rmqdelay = True  # type: ignore[attr-defined]
    underlay._on_confirm_frame = on_confirm_frame


class _Slot:
    """One message's place in aiormq's ``confirmations``: what aiormq calls on a confirm
    future there (``done``, ``cancelled``, ``set_result``, ``set_exception``) and nothing
    more. A future per message cost a future, three done callbacks and two entries in
    aiormq's future stores, each a call_soon when it resolved: most of the window's
    client CPU and of the garbage the collector then walked (bench/README.md).

    It also keeps the message and the :class:`~rmqdelay.core.plan.Route` it was sent
    with, all its outcome needs: no ``Outgoing`` and ``DelayPlan`` per message live
    until the batch ends."""

    __slots__ = ("book", "chunk", "message", "message_id", "route", "tag", "value")

    def __init__(self, book: Confirms, chunk: int, message: Prepared, route: Route, tag: int):
        self.book, self.chunk, self.message, self.route, self.tag = (
            book,
            chunk,
            message,
            route,
            tag,
        )
        self.message_id = message.message_id
        self.value: object = None
        """None while unconfirmed; then True (acked), what aiormq set (a return, a nack),
        or :data:`DROPPED`."""

    def done(self) -> bool:
        return self.value is not None

    def cancelled(self) -> bool:
        """True once given up on: aiormq then logs a late confirm at DEBUG only."""
        return self.value is DROPPED

    def set_result(self, _frame: object) -> None:
        self.book.settle(self, True)

    def set_exception(self, exc: BaseException) -> None:
        self.book.settle(self, exc)


DROPPED = object()
"""A slot no confirm came for in time, or whose channel closed first."""


class Confirms:
    """The confirms of one batch on one channel, for a sliding window: the messages
    written so far (:func:`write_window`), how many still wait, and a wait until no more
    than so many do. One future per batch, in the channel's own store, learns when the
    channel or its connection closes (aiormq rejects every future it holds then)."""

    def __init__(self, underlay: Any) -> None:
        self.slots: list[_Slot] = []
        self.outstanding = 0
        self.closed: BaseException | None = None
        """Why the channel or its connection closed during the batch."""
        self._ids: dict[str, int] = underlay.message_id_delivery_tag
        self._loop = asyncio.get_running_loop()
        self._sent_at: list[float] = []
        self._left: list[int] = []
        self._oldest = 0
        self._waiter: asyncio.Future[None] | None = None
        self._wake_at = 0
        self._sentinel: asyncio.Future[Any] = underlay.create_future()
        self._sentinel.add_done_callback(self._on_sentinel)
        _confirm_at_once(underlay)

    def _on_sentinel(self, sentinel: asyncio.Future[Any]) -> None:
        if sentinel.cancelled():
            self.closed = asyncio.CancelledError("the channel was closed")
        elif (exc := sentinel.exception()) is not None:
            self.closed = exc
        else:
            return  # finish() resolved it
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def settle(self, slot: _Slot, value: object) -> None:
        """A confirm, a return or a nack for ``slot``, from aiormq."""
        if slot.value is not None:
            return
        slot.value = value
        if self._ids.get(slot.message_id) == slot.tag:
            del self._ids[slot.message_id]
        self._left[slot.chunk] -= 1
        self.outstanding -= 1
        if self.outstanding <= self._wake_at:
            self._wake()

    def _sent(self, count: int) -> int:
        """Book a chunk of ``count`` messages written now; its number."""
        self._sent_at.append(self._loop.time())
        self._left.append(count)
        self.outstanding += count
        return len(self._left) - 1

    async def wait(self, at_most: int, timeout: float) -> bool:
        """Until at most ``at_most`` messages wait for a confirm: False when the channel
        closed first, or the oldest waiting message has waited ``timeout`` seconds."""
        while self.outstanding > at_most:
            if self.closed is not None:
                return False
            while self._left[self._oldest] == 0:
                self._oldest += 1
            left = self._sent_at[self._oldest] + timeout - self._loop.time()
            if left <= 0:
                return False
            self._waiter = waiter = self._loop.create_future()
            self._wake_at = at_most
            timer = self._loop.call_later(left, self._wake)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return True

    def take(self) -> list[_Slot]:
        """The slots, handed over once :meth:`finish` ran: the book keeps none. A slot
        refers to its book, so a book that kept them would make a cycle, and every
        message of the batch would live on until the garbage collector's next full
        collection (the costliest part of its work) instead of going with the batch."""
        slots, self.slots = self.slots, []
        return slots

    def finish(self) -> None:
        """Give up on what still waits (a late confirm is then ignored quietly), and
        take the batch's future out of the channel's store."""
        for slot in self.slots:
            if slot.value is None:
                slot.value = DROPPED
                if self._ids.get(slot.message_id) == slot.tag:
                    del self._ids[slot.message_id]
        self.outstanding = 0
        if not self._sentinel.done():
            self._sentinel.set_result(None)


def _closing(underlay: Any, book: Confirms) -> bool:
    """Whether the channel is closed or closing, as aiormq knows right now: the broker's
    Channel.Close is answered (CloseOk queued) before the channel's futures learn of it,
    and a publish written after that CloseOk closes the whole connection ("expected
    'channel.open'"). Then nothing is written and ``book.closed`` says why."""
    reason = getattr(underlay, "_close_exception", None)
    if reason is None and underlay.is_closed:
        reason = aiormq.exceptions.ChannelInvalidStateError("the channel is closed")
    if reason is not None and book.closed is None:
        book.closed = reason
    return book.closed is not None


async def write_window(
    underlay: Any,
    book: Confirms,
    messages: Sequence[Prepared],
    route: Callable[[Prepared], Route],
) -> bool:
    """Write ``messages`` as one write of frames, each routed by ``route`` right before
    it is encoded and given its slot in the channel's books (:class:`Confirms`), under
    the channel's lock, as ``aiormq.Channel.basic_publish`` does for one. False when
    the channel is closing: nothing was written (``book.closed`` says why).

    aiormq spends, per publish, a lock, a timeout scope, a frame object each and a
    write: on the publish path that was most of the client's time (bench/README.md).
    """
    frame_max = underlay.connection.connection_tune.frame_max
    number = underlay.number
    routes = [route(message) for message in messages]
    async with underlay.lock:
        first = underlay.delivery_tag + 1
        payload = b"".join(
            [
                encode_publish(
                    number,
                    where.exchange,
                    where.publish_key,
                    message.encoded_properties,
                    message.body,
                    frame_max=frame_max,
                )
                for message, where in zip(messages, routes)  # noqa: B905 (as long)
            ]
        )
        frame = ChannelFrame(payload=payload, should_close=False)
        if _closing(underlay, book):
            return False
        # queued first: the writer cannot send it, nor a confirm come, before the
        # books below are written, as nothing here awaits after the put
        await underlay.write_queue.put(frame)
        if _closing(underlay, book):  # while it waited for room: take the bytes back
            object.__setattr__(frame, "payload", b"")  # still queued: nothing is sent
            return False
        chunk = book._sent(len(messages))
        confirmations, ids, slots = underlay.confirmations, underlay.message_id_delivery_tag, []
        for tag, message, where in zip(range(first, first + len(routes)), messages, routes):  # noqa: B905
            slot = _Slot(book, chunk, message, where, tag)
            confirmations[tag] = slot
            ids[slot.message_id] = tag
            slots.append(slot)
        book.slots += slots
        underlay.delivery_tag = first + len(messages) - 1
    return True


AT_ONCE = "rmqdelay_at_once"
"""The attribute of a consumer callback naming its plain-function twin (see
:func:`deliver_at_once`)."""


def deliver_at_once(underlay: Any) -> bool:
    """Hand each delivery to its consumer as the frames are read, on this channel, for a
    consumer callback that carries a plain-function twin under :data:`AT_ONCE`.

    aiormq starts a task per delivery to run the consumer's coroutine (a task, a wrapper,
    an entry in the channel's future store, two done callbacks: a tenth of the worker's
    client CPU per message). The worker's callback only hands the delivery to a task of
    its own, which must outlive a closing channel anyway; its twin does that without
    aiormq's task. Any other consumer goes through aiormq's ``_on_deliver_frame`` as
    before. False where this aiormq lacks what that needs (or ``RMQDELAY_CLIENT_FAST=0``):
    aiormq's task then calls the coroutine, the same outcome. aiormq 6.8 and 6.9 read
    the method once, when the channel opens: there the coroutine is called too.
    """
    original: Any = getattr(underlay, "_on_deliver_frame", None)
    if getattr(original, "rmqdelay", False):
        return True
    get_header: Any = getattr(underlay, "_Channel__get_content_header", None)
    read_content: Any = getattr(underlay, "_read_content", None)
    consumers = getattr(underlay, "consumers", None)
    if (
        not client_fast()
        or not all(callable(f) for f in (original, get_header, read_content))
        or not isinstance(consumers, dict)
    ):
        return False

    async def on_deliver_frame(frame: Any) -> None:
        consumer = underlay.consumers.get(frame.consumer_tag)
        at_once = getattr(consumer, AT_ONCE, None)
        if at_once is None:
            await original(frame)
            return
        header = await get_header()
        message = await read_content(frame, header)
        try:
            at_once(message)
        except Exception:  # as aiormq logs a failed consumer: never stop the reader
            _consumer_log.exception("consumer callback failed")

    on_deliver_frame.rmqdelay = True  # type: ignore[attr-defined]
    underlay._on_deliver_frame = on_deliver_frame
    return True


def _frame_problem(frame: type = ChannelFrame) -> str:
    """What stops :func:`queue_made_late` on this aiormq: empty when nothing does."""
    if not dataclasses.is_dataclass(frame):
        return "aiormq.abc.ChannelFrame is no longer a dataclass"
    fields = {field.name for field in dataclasses.fields(frame)}
    if not {"payload", "should_close", "drain_future"} <= fields:
        return "aiormq.abc.ChannelFrame has no payload, should_close or drain_future"
    if not callable(getattr(frame, "drain", None)) or not isinstance(
        getattr(frame, "should_drain", None), property
    ):
        return "aiormq.abc.ChannelFrame has no drain() or should_drain"
    return ""


LATE_PROBLEM = _frame_problem()
"""Why :func:`queue_made_late` is off for this process, or empty."""


class _MadeLate(ChannelFrame):
    """A frame whose bytes are made when aiormq's writer reads them (``payload``), once:
    what was asked for up to that moment goes in it. Written on a closed or closing
    channel, it is empty, and its drain future says why."""

    _underlay: Any
    _make: Callable[[], bytes]
    _made: bytes | None

    def __init__(
        self, underlay: Any, make: Callable[[], bytes], drain: asyncio.Future[Any]
    ) -> None:
        # a frozen dataclass: its fields are set as its own __init__ sets them
        object.__setattr__(self, "should_close", False)
        object.__setattr__(self, "drain_future", drain)
        object.__setattr__(self, "_underlay", underlay)
        object.__setattr__(self, "_make", make)
        object.__setattr__(self, "_made", None)

    @property
    def payload(self) -> bytes:
        made = self._made
        if made is None:  # read once by the writer; a debug log's repr reads it too
            reason = _gone(self._underlay)
            drain: asyncio.Future[Any] = self.drain_future  # type: ignore[assignment]
            if reason is not None:
                made = b""
                if not drain.done():
                    drain.set_exception(reason)
            else:
                made = self._make()
            object.__setattr__(self, "_made", made)
        return made

    def __repr__(self) -> str:
        return f"<rmqdelay frame made late ({'made' if self._made is not None else 'queued'})>"


def _gone(underlay: Any) -> BaseException | None:
    """Why a frame must not be written on this channel now (closed, or answering the
    broker's close: see :func:`_closing`), or None."""
    reason: BaseException | None = getattr(underlay, "_close_exception", None)
    if reason is None:
        closing = getattr(underlay, "_Channel__close_event", None)  # basic_ack checks it
        if underlay.is_closed or (closing is not None and closing.is_set()):
            reason = aiormq.exceptions.ChannelInvalidStateError(f"{underlay!r} closed")
    return reason


def can_queue_made_late(underlay: Any) -> bool:
    """Whether :func:`queue_made_late` may run on this channel; otherwise the worker acks
    through ``basic_ack``."""
    if LATE_PROBLEM or not client_fast():
        return False
    return (
        isinstance(getattr(underlay, "write_queue", None), asyncio.Queue)
        and isinstance(getattr(underlay, "number", None), int)
        and callable(getattr(underlay, "create_future", None))
        and hasattr(underlay, "is_closed")
    )


def queue_made_late(underlay: Any, make: Callable[[], bytes]) -> asyncio.Future[Any] | None:
    """Queue a frame for the connection's writer whose bytes ``make`` returns when the
    writer takes it; the future resolves once they are written, and fails when the
    channel closes first (it is in the channel's own store). None, and nothing queued,
    when the writer's queue is full or the channel is closed or closing.

    Why: the worker's acks went to aiormq as a task that ran on the loop's next turn and
    queued a ``basic.ack``, which the writer wrote a turn later. Queued at the first ack
    of a turn and made as it leaves, the frame goes a turn sooner and still carries every
    ack asked for until then (bench/README.md, the worker's drain).
    """
    if _gone(underlay) is not None:
        return None
    drain: asyncio.Future[Any] = underlay.create_future()
    try:
        underlay.write_queue.put_nowait(_MadeLate(underlay, make, drain))
    except asyncio.QueueFull:
        drain.cancel()
        return None
    return drain
