"""Running a worker: the connection loop, and a graceful shutdown.

Each session (:mod:`.session`) consumes the chosen work queues; :mod:`.process` runs
each delivery through the hooks, its handler and the settler. A dropped connection
starts a new session after a pause (:mod:`.reconnect`); what was in flight comes back
from the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import signal
from collections.abc import Iterable

from ..amqp.consumers import broker_version
from ..core import tracing
from ..core.handling.handlers import HandlerSpec
from ..core.journal.tombstones import Tombstones
from ..errors import WorkerError
from ..settings import Settings
from .cancel import CancelFilter
from .heap import freeze_startup_heap
from .hooks import Hooks, WorkerHook
from .keys import KeyFilter, KeysUnseen
from .logs import LogHook
from .metrics import MetricsHook
from .process import Processor
from .reconnect import RETRIED, reconnect_delay, why_retry
from .recurring import RecurringHook, RecurringUnseen
from .session import Consuming, Session, first
from .tracing import TracingHook

__all__ = ["RunningWorker"]

log = logging.getLogger("rmqdelay.worker")
_MAX_PREFETCH = 65_535
"""AMQP's ``prefetch-count`` is a 16-bit field."""
_MAX_CONSUMER_TIMEOUT_S = 2**31 / 1000
"""RabbitMQ's largest consumer timeout (ms in a signed 32-bit integer)."""


class RunningWorker:
    """Consume the chosen work queues until stopped; reconnect when the connection drops.

    ``hooks`` run after the worker's own: the cancel and keys filters (with the schedule
    journal), metrics and logs.
    """

    def __init__(
        self,
        settings: Settings,
        handlers: list[HandlerSpec],
        *,
        hooks: Iterable[WorkerHook] = (),
        concurrency: int = 8,
        prefetch: int | None = None,
        shutdown_timeout: float = 30.0,
        consumer_timeout: float | None = None,
    ) -> None:
        if not 1 <= concurrency <= 10_000:
            raise WorkerError(f"--concurrency must be from 1 to 10000, got {concurrency}")
        # a held destination's consumer takes room for what it holds too (unless told)
        held_prefetch = min(_MAX_PREFETCH, concurrency + settings.max_held)
        if prefetch is not None:
            held_prefetch = prefetch
        prefetch = concurrency if prefetch is None else prefetch
        if not 1 <= prefetch <= _MAX_PREFETCH:
            raise WorkerError(f"--prefetch must be from 1 to 65535, got {prefetch}")
        if shutdown_timeout < 0:
            raise WorkerError(f"shutdown timeout must not be negative, got {shutdown_timeout}")
        if consumer_timeout is not None and not 0 < consumer_timeout <= _MAX_CONSUMER_TIMEOUT_S:
            raise WorkerError(
                f"consumer timeout must be from 0.001 to {_MAX_CONSUMER_TIMEOUT_S:g} seconds, "
                f"got {consumer_timeout}"
            )
        self.settings = settings
        self.layout = settings.layout
        self.handlers = {spec.destination: spec for spec in handlers}
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.shutdown_timeout = shutdown_timeout
        self.consumer_timeout = consumer_timeout
        self.ready = asyncio.Event()
        self.connects = 0
        self.abandoned = 0
        self.stop_signal: int | None = None
        self._stop = asyncio.Event()
        self._abort = asyncio.Event()
        own: list[WorkerHook] = [MetricsHook(), LogHook()]
        if tracing.active():  # the process imported OpenTelemetry: a span per handling
            own.insert(0, TracingHook())
        self.tombstones = Tombstones()
        self.keys: KeyFilter | None = None
        self.recurring: RecurringHook | None = None
        if self.layout.journal:
            cancels = CancelFilter(settings)
            self.tombstones = cancels.tombstones
            self.keys = KeyFilter(self.layout, settings.confirm_timeout, cancels)
            # after the keys filter: an occurrence is this worker's before its chain moves on
            self.recurring = RecurringHook(cancels)
            # first: a cancelled message is neither timed nor logged
            own[:0] = [cancels, self.keys, self.recurring]
        else:
            own[:0] = [KeysUnseen(), RecurringUnseen()]
        self.hooks = Hooks([*own, *hooks])
        self._not_consuming = asyncio.Event()
        """Set once the consumers are cancelled at shutdown: messages that never started
        are then given back, and not delivered to this worker again."""
        self._processor = Processor(
            concurrency,
            self.hooks,
            self._not_consuming,
            hold_ms=self.layout.hold_ms,
            max_held=settings.max_held,
        )
        self._consuming = Consuming(
            self.prefetch,
            self._processor.on_message,
            self._processor.on_taken_back,
            None if consumer_timeout is None else math.ceil(consumer_timeout * 1000),
            held_prefetch,
        )
        self._told_timeout = False
        self._rng = random.Random()
        self._try_last: list[str] = []
        """The address of a node that stopped confirming: tried after the others."""

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Stop consuming and let in-flight handlers finish (up to the shutdown timeout)."""
        self.ready.clear()
        self._stop.set()

    def abort(self) -> None:
        """Stop at once: unacked messages go back to their queues."""
        self.stop()
        self._abort.set()

    def signal(self, signum: int) -> None:
        """The first signal stops gracefully, the second at once."""
        name = signal.Signals(signum).name
        if self._stop.is_set():
            log.warning("%s again: stopping now; unacked messages return to their queues", name)
            self.abort()
        else:
            self.stop_signal = signum
            log.info(
                "%s: no new messages; waiting up to %gs for %d running handler(s) "
                "(send it again to stop now)",
                name,
                self.shutdown_timeout,
                self.busy,
            )
            self.stop()

    @property
    def busy(self) -> int:
        """Handlers running now (messages waiting for a slot are not counted)."""
        return self._processor.busy

    @property
    def held(self) -> int:
        """Deliveries held unacked until their due time."""
        return len(self._processor.holder)

    @property
    def taken_back(self) -> int:
        """Handlings whose message the broker took back, kept for their redelivery."""
        return len(self._processor.taken)

    @property
    def exit_code(self) -> int:
        if self._abort.is_set():
            return 128 + (self.stop_signal or signal.SIGINT)
        return 0

    # ------------------------------------------------------------------ main loop

    async def run_until_signalled(self) -> int:
        """:meth:`run`, stopped by SIGTERM or SIGINT (gracefully, then at once), in a
        process of its own: once consuming, its start-up heap is frozen
        (:func:`~.heap.freeze_startup_heap`)."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            loop.add_signal_handler(sig, self.signal, sig)
        freezing = asyncio.create_task(self._freeze_once_consuming())
        try:
            return await self.run()
        finally:
            freezing.cancel()
            for sig in signals:
                loop.remove_signal_handler(sig)

    async def _freeze_once_consuming(self) -> None:
        await self.ready.wait()
        log.debug("froze %d start-up objects", freeze_startup_heap())

    async def run(self) -> int:
        """Consume until :meth:`stop`; return 0 after a graceful stop."""
        self._processor.loop = asyncio.get_running_loop()
        failures = 0
        session: Session | None = None
        try:
            while not self._stop.is_set():
                try:
                    session = await self._open()
                except WorkerError:
                    raise
                except RETRIED as exc:
                    why = why_retry(exc, self.settings.masked_url)
                    delay = reconnect_delay(failures, self._rng.random())
                    failures += 1
                    log.warning(
                        "%s; retrying in %.1fs (attempt %d)",
                        why,
                        delay,
                        failures,
                        extra={"url": self.settings.masked_url},
                    )
                    await self._sleep_unless_stopped(delay)
                    continue
                failures = 0
                self.connects += 1
                self._tell_consumer_timeout(session)
                self.ready.set()
                log.info(
                    "consuming %s (concurrency %d, prefetch %d per queue)%s",
                    ", ".join(self.handlers),
                    self.concurrency,
                    self.prefetch,
                    self._held_text(session),
                    extra={"url": self.settings.masked_url},
                )
                watches = (
                    asyncio.create_task(session.watch_node(self.settings)),
                    asyncio.create_task(session.watch_consumers()),
                )
                await first(self._stop.wait(), session.lost.wait())
                for watch in watches:
                    watch.cancel()
                if session.cut_off is not None:
                    self._try_last = [session.cut_off] if session.cut_off else []
                if not self._stop.is_set():
                    self.ready.clear()
                    log.warning(
                        "lost the connection to %s%s; reconnecting (the broker redelivers "
                        "what was in flight)",
                        self.settings.masked_url,
                        f" ({session.lost_error})" if session.lost_error else "",
                    )
                    self._processor.holder.taken_back(session, None)
                    await session.close(self.hooks)
                    session = None
                    await self._sleep_unless_stopped(0.2 + self._rng.random() * 0.3)
            await self._shutdown(session)
        finally:
            self._processor.executor.shutdown(wait=False, cancel_futures=True)
        return self.exit_code

    def _held_text(self, session: Session) -> str:
        if not session.held:
            return ""
        return (
            f"; held until due: {', '.join(sorted(session.held))} (prefetch "
            f"{self._consuming.prefetch_for(True)}, max_held {self.settings.max_held})"
        )

    async def _open(self) -> Session:
        return await Session.open(
            self.settings, self.handlers, self.hooks, self._consuming, self._try_last
        )

    def _tell_consumer_timeout(self, session: Session) -> None:
        """Say once when the broker ignores the consumer timeout the worker asks for."""
        if self.consumer_timeout is None or self._told_timeout:
            return
        self._told_timeout = True
        version = broker_version(session.connection)
        if version is not None and version < (4, 3):
            log.warning(
                "RabbitMQ %s ignores the consumer timeout this worker asks for (%gs) on "
                "quorum queues (4.3 honours it): set consumer_timeout in rabbitmq.conf, or "
                "a consumer-timeout policy on the work queues (3.12 and later)",
                ".".join(map(str, version)),
                self.consumer_timeout,
            )

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _shutdown(self, session: Session | None) -> None:
        """Stop consuming, wait for in-flight handlers, then close."""
        if session is not None:
            await session.stop_consuming()
        self._not_consuming.set()
        self._processor.stopped()
        if session is not None and not session.lost.is_set():
            returned = self._processor.give_back_held()
            if returned:
                log.info("returning %d held message(s) to their queues, unhandled", returned)
        else:
            self._processor.holder.drain()  # the broker has them back already
        inflight = self._processor.inflight
        pending = set(inflight)
        if pending and not self._abort.is_set():
            timeout = self.shutdown_timeout
            done_waiting = asyncio.ensure_future(asyncio.wait(pending, timeout=timeout))
            await first(done_waiting, self._abort.wait())
            done_waiting.cancel()
        pending = {t for t in inflight if not t.done()}
        if pending:
            self.abandoned = len(pending)
            log.warning(
                "%d handler(s) still running: their messages return to the queue",
                len(pending),
            )
            for task in pending:
                task.cancel()
            await asyncio.wait(pending, timeout=1)
        if session is not None:
            await session.close(self.hooks)
        log.info("stopped")
