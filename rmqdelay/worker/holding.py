"""Holding early deliveries unacked until their due time, with one timer for them all.

:func:`rmqdelay.core.handling.hold.hold_action` decides; this module keeps the held
deliveries in a heap by due time and arms one ``loop.call_at`` for the earliest. At its
due time by the worker's own clock a delivery is released: only then does it start its
way through the hooks (cancels, keys, recurring schedules) and its handler, so a cancel
issued while it was held skips it. A held delivery takes no handler slot: one due now
that arrives behind many held ones is handled at once. The prefetch bounds how many
come (``concurrency + max_held`` for a held destination); ``rmqdelay_held_messages``
counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from ..core.clock import now_ms
from ..core.handling.handlers import HandlerSpec
from ..core.handling.hold import HeldCount, HoldHeap
from .delivery import Delivery
from .hooks import Hooks
from .metrics import HELD
from .session import Session
from .settle import SETTLE_ERRORS

__all__ = ["Held", "Holder", "redelay"]

log = logging.getLogger("rmqdelay.worker")


@dataclass(eq=False, slots=True)
class Held:
    """A delivery waiting for its due time, unacked."""

    session: Session
    spec: HandlerSpec
    message: AbstractIncomingMessage
    delivery: Delivery
    due_ms: int


class Holder:
    """The worker's held deliveries; ``release`` starts each once due."""

    def __init__(self, max_held: int, release: Callable[[Held], None]) -> None:
        self.max_held = max_held
        self._release = release
        self._heap: HoldHeap[Held] = HoldHeap()
        self._counts: dict[str, HeldCount] = {}
        self._gauges: dict[str, Any] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_ms: int | None = None

    def __len__(self) -> int:
        return len(self._heap)

    def hold(
        self,
        session: Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        due_ms: int,
    ) -> None:
        """Keep ``message`` unacked until ``due_ms`` (Unix ms, the worker's clock)."""
        destination = spec.destination
        count = self._counts.get(destination)
        if count is None:
            count = self._counts[destination] = HeldCount(self.max_held)
            self._gauges[destination] = HELD.labels(destination)
        if count.add():
            log.warning(
                "holding %d messages for %s, its max_held (%d): it takes no more than its "
                "prefetch lets the broker send until some are due (raise max_held, or run "
                "more workers)",
                count.count,
                destination,
                self.max_held,
                extra={"destination": destination},
            )
        self._gauges[destination].set(count.count)
        if self._heap.push(due_ms, Held(session, spec, message, delivery, due_ms)):
            self._arm(due_ms)

    def _arm(self, due_ms: int) -> None:
        """One timer, for the earliest due time: moved when an earlier one comes."""
        if self._timer is not None:
            if self._timer_ms is not None and self._timer_ms <= due_ms:
                return
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        # the wall clock decides (due times are Unix ms); the loop's timer is monotonic
        wait_s = max(0.0, (due_ms - time.time() * 1000) / 1000)
        self._timer = loop.call_at(loop.time() + wait_s, self._fire)
        self._timer_ms = due_ms

    def _fire(self) -> None:
        self._timer = self._timer_ms = None
        for held in self._heap.pop_due(now_ms()):
            self._forget(held)
            self._release(held)
        due = self._heap.next_due()
        if due is not None:  # a timer may fire a little before the wall clock says
            self._arm(due)

    def _forget(self, held: Held) -> None:
        destination = held.spec.destination
        count = self._counts[destination]
        count.remove()
        self._gauges[destination].set(count.count)

    def taken_back(self, session: Session, tag: str | None) -> int:
        """The broker took back what consumer ``tag`` of ``session`` held (all its
        consumers' for None): those are no longer held; how many."""

        def gone(held: Held) -> bool:
            return held.session is session and tag in (None, held.message.consumer_tag)

        taken = self._heap.remove(gone)
        for held in taken:
            self._forget(held)
            if tag is not None:  # the channel lives on: they must not hold back its acks
                session.settler.acks.forget(held.message)
        return len(taken)

    def drain(self) -> list[Held]:
        """Everything held, taken out (the worker stops: they go back to their queues)."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_ms = None
        held = self._heap.drain()
        for item in held:
            self._forget(item)
        return held


async def redelay(
    session: Session,
    spec: HandlerSpec,
    message: AbstractIncomingMessage,
    delivery: Delivery,
    due_ms: int,
    hooks: Hooks,
) -> None:
    """Due too far ahead to hold (the consumer timeout would take it back): published
    again due at the same time, confirmed (the same id, headers and attempt, recorded in
    the journal as a retry is), then acked; the copy comes back within the hold window.
    The cancel and keys hooks are asked when that copy is released, not now."""
    if session.taken_back(message):
        return
    ahead_s = (due_ms - delivery.received_ms) / 1000
    reason = f"due in {ahead_s:.1f}s, past the hold window: sent round the delay tiers again"
    try:
        settled = await session.settler.forward(spec, message, delivery, due_ms, reason)
    except Exception:  # a bug of ours: never leave the message unacked for good
        log.exception("internal error; requeueing the message", extra=delivery.fields)
        with contextlib.suppress(*SETTLE_ERRORS):
            await session.settler.acks.reject(message, requeue=True)
        return
    hooks.settled(delivery, settled)
