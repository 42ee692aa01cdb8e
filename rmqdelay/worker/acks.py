"""A session's acks, batched: contiguous acks go as one ``basic.ack`` with ``multiple``.

Each :meth:`Acker.ack` is asked for once its message is done (the handler succeeded,
any republish or parked copy confirmed) and waits until the ack is written. The first
ack asked for when none is waiting queues a frame for the connection's writer whose
bytes are made as the writer takes it (:func:`~rmqdelay.amqp.aiormq_private.queue_made_late`):
every ack asked for until then goes in it, the done run from the lowest unsettled
delivery as one ``multiple`` ack, every other done one alone (a slow handler below it
must not hold it). Where that reach is off (``RMQDELAY_CLIENT_FAST=0``, an aiormq it
does not know, a full write queue), a task sends what was asked for while the event
loop turned through ``basic_ack``, one frame at a time. Rejects and nacks go alone at
once. What may be sent is :class:`rmqdelay.core.handling.acks.AckLedger`'s to say; this module
sends it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from ..amqp.aiormq_private import can_queue_made_late, queue_made_late
from ..core.handling.acks import AckLedger, AckPlan, TagState
from ..core.wire import encode_acks

__all__ = ["Acker"]


def _lost(error: BaseException) -> BaseException:
    """What a frame's failure says: aiormq fails a drain with its connection's closing
    reason, at times a bare ``Exception``, which is a lost channel all the same (so the
    settling's ``SETTLE_ERRORS`` know it)."""
    if type(error) is Exception:
        return ConnectionError(f"the channel closed before the frame was written ({error!r})")
    return error


class _Frame:
    """The acks one frame made late carries: its waiters and single acks, once made."""

    __slots__ = ("made", "over", "singles", "waiters")

    def __init__(self) -> None:
        self.made = False
        self.over = False
        """Written, or failed before the writer took it: it takes no more acks."""
        self.waiters: list[asyncio.Future[None]] = []
        self.singles: tuple[int, ...] = ()


class Acker:
    """The acks, rejects and nacks of the deliveries of one consuming channel."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        """The consumers' aiormq channel (its ``basic_ack``, or its writer's queue)."""
        self.ledger = AckLedger()
        self._waiters: list[asyncio.Future[None]] = []
        """One per ack asked for and not yet in a frame; resolved once it is written."""
        self._pending = False
        """A frame (made late) or the flusher task will take ``_waiters``."""
        self._flusher: asyncio.Task[None] | None = None
        self._late = can_queue_made_late(channel)
        self.frames = 0
        """``basic.ack`` frames sent (for tests and benches: fewer than acks)."""
        self.made_late = 0
        """Of those, frames made as the writer took them (for tests and benches)."""

    def delivered(self, message: AbstractIncomingMessage) -> None:
        """Called for each delivery as it arrives, before any other of its steps."""
        self.ledger.delivered(message.delivery_tag or 0)

    def settled(self, message: AbstractIncomingMessage) -> bool:
        """Whether an ack, reject or nack of ``message`` was asked for already."""
        return self.ledger.state(message.delivery_tag or 0) is not TagState.OPEN

    def forget(self, message: AbstractIncomingMessage) -> None:
        """The broker took ``message`` back (its consumer was cancelled): it is not
        this channel's to settle, and must not hold back the acks after it."""
        self.ledger.forget(message.delivery_tag or 0)

    async def ack(self, message: AbstractIncomingMessage) -> None:
        """Ack ``message`` with the next frame; raises what sending it raised."""
        self.ledger.done(message.delivery_tag or 0)
        loop = asyncio.get_running_loop()
        # one future each: a cancelled waiter cancels only its own
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        if not self._pending:
            self._pending = True
            if not (self._late and self._queue_late()):
                self._flusher = loop.create_task(self._flush())
        await waiter

    async def reject(self, message: AbstractIncomingMessage, *, requeue: bool) -> None:
        await self._alone(message, message.reject(requeue=requeue))

    async def nack(self, message: AbstractIncomingMessage, *, requeue: bool) -> None:
        await self._alone(message, message.nack(requeue=requeue))

    async def _alone(self, message: AbstractIncomingMessage, frame: Any) -> None:
        """Send a frame for ``message`` alone; no batch covers it until it is out."""
        tag = message.delivery_tag or 0
        try:
            self.ledger.sending(tag)
        except ValueError:
            frame.close()
            raise
        try:
            await frame
        except Exception as exc:
            lost = _lost(exc)
            if lost is exc:
                raise
            raise lost from exc
        finally:
            self.ledger.sent(tag)

    # ------------------------------------------------------------ made late

    def _queue_late(self) -> bool:
        """Queue a frame made as the writer takes it; False when none could be queued."""
        frame = _Frame()
        drain = queue_made_late(self._channel, lambda: self._make(frame))
        if drain is None:
            return False
        drain.add_done_callback(lambda done: self._written(frame, done))
        return True

    def _make(self, frame: _Frame) -> bytes:
        """The writer takes the frame: every ack asked for until now goes in it."""
        if frame.over:  # failed while queued: its acks went with it
            return b""
        frame.made = True
        frame.waiters, self._waiters = self._waiters, []
        self._pending = False
        plan = self.ledger.take()
        frame.singles = plan.singles
        count = (plan.multiple is not None) + len(plan.singles)
        self.frames += count
        self.made_late += count
        return encode_acks(self._channel.number, plan.multiple, plan.covered, plan.singles)

    def _written(self, frame: _Frame, drain: asyncio.Future[Any]) -> None:
        """The frame is written, or its channel closed first."""
        frame.over = True
        for tag in frame.singles:
            self.ledger.sent(tag)
        if not frame.made:  # never written: the acks waiting for it fail with it, and
            # leave the ledger as a sent frame's would (no later frame acks them after all)
            frame.waiters, self._waiters = self._waiters, []
            self._pending = False
            for tag in self.ledger.take().singles:
                self.ledger.sent(tag)
        if drain.cancelled():
            for waiter in frame.waiters:
                waiter.cancel()
            return
        error = drain.exception()
        for waiter in frame.waiters:
            if waiter.done():  # its task was cancelled
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(_lost(error))

    # ------------------------------------------------------------ basic_ack

    async def _flush(self) -> None:
        """Send the batches, one at a time (a frame never overtakes an earlier one)."""
        try:
            while self._waiters:
                waiters, self._waiters = self._waiters, []
                try:
                    await self._send(self.ledger.take())
                except Exception as exc:
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_exception(_lost(exc))
                except BaseException:  # cancelled (the loop ends): so are its waiters
                    for waiter in waiters:
                        waiter.cancel()
                    raise
                else:
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_result(None)
        finally:
            self._flusher = None
            self._pending = False

    async def _send(self, plan: AckPlan) -> None:
        # each written before the next is queued, as ``message.ack()`` waits for it
        if plan.multiple is not None:
            self.frames += 1
            await self._channel.basic_ack(plan.multiple, multiple=plan.covered > 1)
        for tag in plan.singles:
            self.frames += 1
            try:
                await self._channel.basic_ack(tag)
            finally:
                self.ledger.sent(tag)
