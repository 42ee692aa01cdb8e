"""A session's acks, batched: contiguous acks go as one ``basic.ack`` with ``multiple``.

Each :meth:`Acker.ack` is asked for once its message is done (the handler succeeded,
any republish or parked copy confirmed) and waits until the ack is written. The acks
asked for while the event loop turns go out together at its next turn: the done run
from the lowest unsettled delivery as one ``multiple`` ack, every other done one alone
(a slow handler below it must not hold it). Rejects and nacks go alone at once. What
may be sent is :class:`rmqdelay.core.acks.AckLedger`'s to say; this module sends it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from ..core.acks import AckLedger, AckPlan, TagState

__all__ = ["Acker"]


class Acker:
    """The acks, rejects and nacks of the deliveries of one consuming channel."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        """The consumers' aiormq channel (its ``basic_ack``)."""
        self.ledger = AckLedger()
        self._next: asyncio.Future[None] | None = None
        """Resolved once the acks asked for since the last flush are written."""
        self._flusher: asyncio.Task[None] | None = None
        self.frames = 0
        """``basic.ack`` frames sent (for tests and benches: fewer than acks)."""

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
        """Ack ``message`` with the next batch; raises what sending it raised."""
        self.ledger.done(message.delivery_tag or 0)
        future = self._next
        if future is None:
            future = self._next = asyncio.get_running_loop().create_future()
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        # shielded: one cancelled waiter must not cancel the batch's other waiters
        await asyncio.shield(future)

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
        finally:
            self.ledger.sent(tag)

    async def _flush(self) -> None:
        """Send the batches, one at a time (a frame never overtakes an earlier one)."""
        try:
            while self._next is not None:
                future, self._next = self._next, None
                try:
                    await self._send(self.ledger.take())
                except Exception as exc:
                    if not future.done():
                        future.set_exception(exc)
                        future.exception()  # retrieved: a batch nobody waits for any more
                except BaseException:  # cancelled (the loop ends): so are its waiters
                    future.cancel()
                    raise
                else:
                    if not future.done():
                        future.set_result(None)
        finally:
            self._flusher = None

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
