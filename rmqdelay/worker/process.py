"""Each delivery's way through the worker: a slot, the hooks, the handler, the settling."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from ..core.handlers import HandlerSpec
from ..core.retry import decide
from .context import Context
from .delivery import Delivery, read_delivery
from .hooks import Hooks
from .session import Session, first
from .settle import SETTLE_ERRORS, Failure

__all__ = ["Processor"]

log = logging.getLogger("rmqdelay.worker")
_handler_log = logging.getLogger("rmqdelay.handler")


class Processor:
    """Runs deliveries, at most ``concurrency`` handlers at a time (async ones on the
    loop, sync ones in a thread pool), until ``stop`` is set."""

    def __init__(self, concurrency: int, hooks: Hooks, stop: asyncio.Event) -> None:
        self.hooks = hooks
        self.busy = 0
        """Handlers running now (messages waiting for a slot are not counted)."""
        self.inflight: set[asyncio.Task[None]] = set()
        self.executor = ThreadPoolExecutor(concurrency, thread_name_prefix="rmqdelay-handler")
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop = stop
        self._slots = asyncio.Semaphore(concurrency)
        self._rng = random.Random()

    async def on_message(
        self, session: Session, spec: HandlerSpec, message: AbstractIncomingMessage
    ) -> None:
        # aiormq cancels its consumer tasks when the channel closes; ours must outlive
        # that, so a handler that is halfway is not cut off by a dropped connection.
        session.active_at = time.monotonic()
        task = asyncio.create_task(self._process(session, spec, message))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    async def _acquire_slot(self) -> bool:
        """Wait for a free handler slot; False when the worker stops first."""
        if self._stop.is_set():
            return False
        if not self._slots.locked():  # a free slot: take it without a task and a wait
            await self._slots.acquire()
            return True
        acquire = asyncio.ensure_future(self._slots.acquire())
        await first(acquire, self._stop.wait())
        if acquire.done() and not acquire.cancelled():
            if self._stop.is_set():
                self._slots.release()
                return False
            return True
        acquire.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            if await acquire:
                self._slots.release()
        return False

    async def _process(
        self, session: Session, spec: HandlerSpec, message: AbstractIncomingMessage
    ) -> None:
        if not await self._acquire_slot():
            # Never started: give it back now, for another worker (nack, not reject).
            if not session.lost.is_set():
                with contextlib.suppress(*SETTLE_ERRORS):
                    await message.nack(requeue=True)
            return
        self.busy += 1
        try:
            if session.lost.is_set():
                return  # the broker has already taken it back
            await self._handle(session, spec, message)
        except Exception:
            # A bug of ours, not the handler's: never leave the message unacked for good.
            log.exception(
                "internal error; requeueing the message", extra={"queue": spec.destination}
            )
            if not message.processed and not session.lost.is_set():
                with contextlib.suppress(*SETTLE_ERRORS):
                    await message.reject(requeue=True)
        finally:
            self.busy -= 1
            self._slots.release()

    async def _handle(
        self, session: Session, spec: HandlerSpec, message: AbstractIncomingMessage
    ) -> None:
        delivery = read_delivery(message, spec.destination)
        if self.hooks.skip(delivery):
            self.hooks.settled(delivery, await session.settler.skip(message))
            return
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
        settled = await session.settler.settle(spec, message, delivery, decision, failure, seconds)
        self.hooks.settled(delivery, settled)

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
            ctx = Context(
                message_id=delivery.message_id,
                destination=spec.destination,
                attempt=delivery.attempt,
                max_attempts=spec.policy.max_attempts,
                due_at=delivery.due_at,
                lateness=delivery.lateness,
                headers=delivery.headers,
                redelivered=delivery.redelivered,
                body=message.body,
                content_type=message.content_type,
                correlation_id=message.correlation_id,
                logger=logging.LoggerAdapter(_handler_log, delivery.fields),
                _publish=session.publisher.publish,
                _loop=self.loop,
            )
            args = (value, ctx)
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
