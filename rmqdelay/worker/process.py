"""Each delivery's way through the worker: a slot, the hooks, the handler, the settling.

A message the broker takes back while its handler runs (a consumer timeout, a lost
connection) is not settled: its handling's outcome waits for the redelivery, which gets
it instead of a second call of the handler (:mod:`rmqdelay.core.handling.takeback`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from ..core.clock import now_ms
from ..core.handling.handlers import HandlerSpec
from ..core.handling.hold import hold_action
from ..core.handling.retry import Decision, decide
from ..core.handling.takeback import Claim, Key, TakenBack, key_of
from .context import handler_context
from .delivery import Delivery, read_delivery
from .holding import Held, Holder, redelay
from .hooks import HANDLE, Admission, Hooks, Settled
from .metrics import CONSUMER_TIMEOUTS
from .session import Cause, Session
from .settle import SETTLE_ERRORS, Failure
from .slots import Slots

__all__ = ["Processor"]

log = logging.getLogger("rmqdelay.worker")
_WAIT_POLL_S = 0.5
"""How often a held redelivery checks whether it was taken back or the worker stops."""


@dataclasses.dataclass(eq=False)
class _Holding:
    """A delivery the worker holds: its handler runs, or it waits for an earlier handling
    of the same message that the broker took back (``waiting``)."""

    session: Session
    consumer_tag: str
    key: Key
    delivery: Delivery
    queue: str
    waiting: bool = False
    taken: bool = False
    """The broker took the message back while the worker held it."""


Outcome = tuple[Decision, Failure | None, float]
"""What a handling came to: its decision, the handler's failure, how long it ran."""


class Processor:
    """Runs deliveries, at most ``concurrency`` handlers at a time (async ones on the
    loop, sync ones in a thread pool), until ``stop`` is set."""

    def __init__(
        self,
        concurrency: int,
        hooks: Hooks,
        stop: asyncio.Event,
        *,
        hold_ms: int = 0,
        max_held: int = 5000,
    ) -> None:
        self.hooks = hooks
        self.hold_ms = hold_ms
        """How early a held destination's messages may come (the layout's hold window)."""
        self.holder = Holder(max_held, self._released)
        """Deliveries that came before their due time, until then (no slot, no task)."""
        self.busy = 0
        """Handlers running now (messages waiting for a slot are not counted)."""
        self.inflight: set[asyncio.Task[None]] = set()
        self.executor = ThreadPoolExecutor(concurrency, thread_name_prefix="rmqdelay-handler")
        self.loop: asyncio.AbstractEventLoop | None = None
        self.taken: TakenBack[Outcome] = TakenBack()
        """Handlings whose message the broker took back, for their redelivery."""
        self._holdings: set[_Holding] = set()
        self._ended: dict[Key, asyncio.Event] = {}
        self._stop = stop
        self._slots = Slots(concurrency)
        self._rng = random.Random()

    def on_message(
        self, session: Session, spec: HandlerSpec, message: AbstractIncomingMessage
    ) -> None:
        """Start the delivery's task. aiormq cancels its consumer tasks when the channel
        closes; ours must outlive that, so a handler that is halfway is not cut off by a
        dropped connection."""
        session.active_at = time.monotonic()
        session.settler.acks.delivered(message)
        delivery = read_delivery(message, spec.destination)
        due_ms = delivery.due_ms
        if due_ms is not None and due_ms > delivery.received_ms:  # early: never handed over
            action = hold_action(due_ms, delivery.received_ms, self.hold_ms)
            if action == "hold":
                self.holder.hold(session, spec, message, delivery, due_ms)
                return
            if action == "redelay":
                self._start(redelay(session, spec, message, delivery, due_ms, self.hooks))
                return
        self._start(self._process(session, spec, message, delivery))

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    def _released(self, held: Held) -> None:
        """A held delivery is due: now it goes the way of any other."""
        self._start(self._process(held.session, held.spec, held.message, held.delivery))

    def give_back_held(self) -> int:
        """The worker stops: every held delivery goes back to its queue unhandled (a
        ``basic.nack``, once the consumers are cancelled); how many."""
        held = self.holder.drain()
        for item in held:
            self._start(self._give_back(item.session, item.message))
        return len(held)

    def on_taken_back(self, session: Session, tag: str | None, cause: Cause) -> None:
        """The broker took back what consumer ``tag`` of ``session`` held (every consumer's
        for None). Handlers keep running; each message they hold is logged and counted."""
        for holding in list(self._holdings):
            if holding.session is session and tag in (None, holding.consumer_tag):
                self._take_back(holding, cause)
        held = self.holder.taken_back(session, tag)
        if held and cause == "consumer timeout":  # they come back, held for what remains
            log.warning(
                "consumer timeout: the broker took back %d held message(s) before their "
                "due time; keep the consumer timeout well over hold_window",
                held,
            )

    def _take_back(self, holding: _Holding, cause: Cause) -> None:
        if holding.taken:
            return
        holding.taken = True
        times = self.taken.took_back(holding.key)
        fields = {**holding.delivery.fields, "queue": holding.queue}
        if cause == "connection lost":
            log.info(
                "the connection was lost while the worker held the message; a redelivery "
                "to this worker gets its handling's outcome",
                extra=fields,
            )
            return
        CONSUMER_TIMEOUTS.labels(holding.delivery.destination).inc()
        what = "waited for its first handling" if holding.waiting else "ran its handler"
        log.warning(
            "consumer timeout: the broker took the message back while the worker %s "
            "(%d time(s)); the handler runs on, and a redelivery to this worker gets "
            "its outcome instead of a second call (one to another worker is handled again)",
            what,
            times,
            extra=fields,
        )

    async def _acquire_slot(self) -> bool:
        """Wait for a free handler slot; False when the worker stops first."""
        if self._stop.is_set():
            return False
        return await self._slots.acquire()

    def stopped(self) -> None:
        """The consumers are cancelled: deliveries waiting for a slot are given back."""
        self._slots.close()

    async def _give_back(self, session: Session, message: AbstractIncomingMessage) -> None:
        """A delivery never started (the worker stops): back to its queue for another
        worker, with ``basic.nack``, which RabbitMQ 4.3 does not count as a failed delivery."""
        if not session.taken_back(message):
            with contextlib.suppress(*SETTLE_ERRORS):
                await session.settler.acks.nack(message, requeue=True)

    async def _process(
        self,
        session: Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
    ) -> None:
        key = key_of(delivery.message_id, delivery.due_ms, delivery.attempt)
        claim = self.taken.claim(key, now_ms())
        if claim == "wait":
            waited = await self._wait_for_first(session, spec, message, delivery, key)
            if waited is None:
                return
            claim = waited
        if not isinstance(claim, str):
            await self._settle_as_first(session, spec, message, delivery, key, claim)
            return
        if not await self._acquire_slot():
            await self._give_back(session, message)
            return
        self.busy += 1
        try:
            if session.taken_back(message):
                return  # prefetched, and the broker took it back before it started
            # lateness counts to the handler's start, the wait for a slot included
            received_ms = now_ms()
            if received_ms != delivery.received_ms:
                delivery = dataclasses.replace(delivery, received_ms=received_ms)
            await self._handle(session, spec, message, delivery, key)
        except Exception:  # a bug of ours, not the handler's
            log.exception("internal error; requeueing the message", extra=delivery.fields)
            await self._requeue(session, message)
        finally:
            self.busy -= 1
            self._slots.release()

    async def _wait_for_first(
        self,
        session: Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        key: Key,
    ) -> Claim[Outcome] | None:
        """Hold a redelivery until the handling the broker took it back from ends; None
        when this delivery is taken back too, or the worker stops (it is given back)."""
        tag = message.consumer_tag or ""
        holding = _Holding(session, tag, key, delivery, session.queue_of(spec), waiting=True)
        self._holdings.add(holding)
        log.info(
            "a redelivery of a message whose handler still runs: it waits for that handler",
            extra=delivery.fields,
        )
        try:
            while True:
                if session.taken_back(message):
                    return None
                if self._stop.is_set():
                    await self._give_back(session, message)
                    return None
                claim = self.taken.claim(key, now_ms())
                if claim != "wait":
                    return claim
                ended = self._ended.setdefault(key, asyncio.Event())
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ended.wait(), _WAIT_POLL_S)
        finally:
            self._holdings.discard(holding)

    async def _settle_as_first(
        self,
        session: Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        key: Key,
        outcome: Outcome,
    ) -> None:
        """Settle a redelivery with the outcome of the handling the broker took it back
        from: no second call of the handler. Should this settling fail too, or the
        session end first (its publisher closed), the outcome waits for the next one."""
        decision, failure, _seconds = outcome
        if session.taken_back(message):
            self.taken.finished(key, outcome, now_ms())
            return
        log.info(
            "a redelivery of a message whose handling ended after the broker took it back: "
            "settled with that handling's outcome (%s), without calling the handler again",
            decision.action,
            extra=delivery.fields,
        )
        try:  # no handler ran for this delivery (its time was counted with the first one's)
            settled = await session.settler.settle(spec, message, delivery, decision, failure, None)
        except Exception as exc:  # a bug of ours (a lost channel is a "returned" settling)
            settled = Settled("returned", problem=f"settling it failed ({exc!r})")
            await self._requeue(session, message)
        self.hooks.settled(delivery, settled)
        if settled.outcome == "returned":
            self.taken.finished(key, outcome, now_ms())

    @staticmethod
    async def _requeue(session: Session, message: AbstractIncomingMessage) -> None:
        """Never leave a message unacked for good (unless the broker has it back)."""
        if not session.settler.acks.settled(message) and not session.taken_back(message):
            with contextlib.suppress(Exception):
                await session.settler.acks.reject(message, requeue=True)

    async def _handle(
        self,
        session: Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        key: Key,
    ) -> None:
        if self.hooks.skip(delivery):
            self.hooks.settled(delivery, await session.settler.skip(message))
            return
        admission = HANDLE
        pending = (
            self.hooks.admit(delivery, message, session.publisher) if self.hooks.admitting else None
        )
        if pending is not None:  # a hook has a say: wait for it
            admission = await pending
            if admission.action != "handle":
                await self._settle_admission(session, spec, message, delivery, admission)
                return
            if session.taken_back(message):
                return  # taken back while it was being admitted: it comes again
        tag = message.consumer_tag or ""
        holding = _Holding(session, tag, key, delivery, session.queue_of(spec))
        self._holdings.add(holding)
        left: Outcome | None = None
        """What a redelivery still needs, should the broker have taken this one back."""
        try:
            outcome = await self._run(session, spec, message, delivery)
            decision, failure, seconds = outcome
            if admission.on_success and decision.action == "ack":
                await self._succeeded(admission, delivery)
            if session.taken_back(message):
                self._take_back(holding, session.cause(message))
            if holding.taken:
                # Settling it now would be lost (no channel) or ignored (4.3): the broker
                # delivers it again, and that delivery gets this outcome.
                left = outcome
                problem = "the broker took the message back while its handler ran"
                error = failure.error if failure is not None else None
                returned = Settled("returned", decision.reason, None, error, None, seconds, problem)
                self.hooks.settled(delivery, returned)
                return
            settled = await session.settler.settle(
                spec, message, delivery, decision, failure, seconds
            )
            self.hooks.settled(delivery, settled)
            if settled.outcome in ("acked", "retried", "parked"):
                # done, and its copy published: should the broker have ignored the ack
                # (taken back meanwhile), the redelivery only needs one
                left = (Decision("ack", decision.attempt), None, seconds)
            elif settled.outcome == "returned":
                left = outcome  # not settled (taken back meanwhile): not a second call either
        finally:
            self._holdings.discard(holding)
            if holding.taken:
                if left is None:
                    self.taken.forget(key)  # not settled: handle the redelivery afresh
                else:
                    self.taken.finished(key, left, now_ms())
                ended = self._ended.pop(key, None)
                if ended is not None:
                    ended.set()

    async def _settle_admission(
        self,
        session: Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        admission: Admission,
    ) -> None:
        """A delivery a hook dropped, forwarded or gave back: its handler is not called."""
        if session.taken_back(message):
            return  # the broker took it back meanwhile: it comes again, and is asked again
        settler = session.settler
        if admission.action == "forward" and admission.forward_due_ms is not None:
            due_ms = admission.forward_due_ms
            settled = await settler.forward(spec, message, delivery, due_ms, admission.reason)
        elif admission.action == "requeue":
            settled = await settler.requeue(message, admission.reason)
        else:
            settled = await session.settler.drop(message, admission.reason)
        self.hooks.settled(delivery, settled)

    async def _succeeded(self, admission: Admission, delivery: Delivery) -> None:
        """The handler returned: what the admission asked for before the ack. One that
        fails is logged; the message is still acked (its handler ran)."""
        for step in admission.on_success:
            try:
                await step()
            except Exception:
                log.exception(
                    "a step after the handler failed; the message is acked all the same",
                    extra=delivery.fields,
                )

    async def _run(
        self,
        session: Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
    ) -> Outcome:
        """Call the handler; what it came to, and how long it ran."""
        started = time.monotonic()
        failure: Failure | None = None
        try:
            value = spec.decoder(message.body, message.content_type)
            await self._call(session, spec, message, delivery, value)
        except asyncio.CancelledError:
            raise
        except Failure as exc:
            failure = exc
        except BaseException as exc:  # every handler error has an outcome
            failure = Failure.of(exc)
        seconds = time.monotonic() - started
        error = failure.error if failure is not None else None
        decision = decide(error, delivery.attempt, spec.policy, self._rng.random())
        return decision, failure, seconds

    async def _call(
        self,
        session: Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        delivery: Delivery,
        value: Any,
    ) -> None:
        args: tuple[Any, ...] = (value,)
        if spec.wants_context:
            publish = session.publisher.publish
            args = (value, handler_context(spec, message, delivery, publish, self.loop))
        if spec.is_async:
            await spec.func(*args)
        else:
            assert self.loop is not None
            failure = await self.loop.run_in_executor(self.executor, _call_sync, spec.func, args)
            if failure is not None:
                raise failure


def _call_sync(func: Callable[..., Any], args: tuple[Any, ...]) -> Failure | None:
    """Run a sync handler in a worker thread; return its failure instead of raising."""
    try:
        func(*args)
    except BaseException as exc:  # every handler error has an outcome
        return Failure.of(exc)
    return None
