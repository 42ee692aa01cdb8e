"""The async publisher's window on aiormq's private books.

:func:`write_window` sends messages as one write of frames rmqdelay encoded, with a
slot per message in the channel's own books (``confirmations``,
``message_id_delivery_tag``, ``delivery_tag``, under its ``lock``, written to the
connection's ``write_queue``), so returns, nacks and a closing channel reach each message
as they reach ``aiormq.Channel.basic_publish``'s own. A slot is not a future: it has
only what aiormq's ``_confirm_delivery`` and ``_on_return_frame`` call on one
(:class:`_Slot`), and :class:`Confirms` keeps a sliding window over the slots of a
batch. None of that is aiormq's public API: the package's
:func:`~rmqdelay.amqp.aiormq_private.can_write_frames` says where it may run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import aiormq
from aiormq.abc import ChannelFrame

from ...core.plan import Route
from ...core.publishing.outgoing import Prepared
from ...core.wire import encode_publish

__all__ = ["DROPPED", "Confirms", "write_window"]


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


def why_closed(underlay: Any) -> BaseException | None:
    """Why nothing may be written on this channel now, or None: it is closed, or closing
    as aiormq knows right now (its ``basic_ack`` checks the same). The broker's
    Channel.Close is answered (CloseOk queued) before the channel's futures learn of it,
    and a frame written after that CloseOk closes the whole connection ("expected
    'channel.open'")."""
    reason: BaseException | None = getattr(underlay, "_close_exception", None)
    if reason is None:
        closing = getattr(underlay, "_Channel__close_event", None)
        if underlay.is_closed or (closing is not None and closing.is_set()):
            reason = aiormq.exceptions.ChannelInvalidStateError(f"{underlay!r} closed")
    return reason


def _closing(underlay: Any, book: Confirms) -> bool:
    """Whether the channel is closed or closing (:func:`why_closed`): then nothing is
    written and ``book.closed`` says why."""
    reason = why_closed(underlay)
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
