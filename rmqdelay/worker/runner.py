"""Running a worker: the connection loop, handler slots, and a graceful shutdown.

Each delivery gets a slot, its handler runs (async on the loop, sync in a thread), and
:class:`~rmqdelay.worker.settle.Settler` settles it. A dropped connection starts a new
session; what was in flight comes back from the broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue

from ..amqp.aio_publisher import AsyncPublisher
from ..amqp.connections import address_of, connect_async
from ..amqp.journal import JournalTail, write_probe
from ..amqp.passive import queue_exists_async
from ..core.context import Context
from ..core.handlers import HandlerSpec
from ..core.journal import Tombstones
from ..core.retry import decide
from ..errors import AccessRefusedError, ConnectionFailedError, TopologyError, WorkerError
from ..settings import Settings, mask_url
from .metrics import HANDLED, HANDLER_SECONDS, LATENESS
from .settle import SETTLE_ERRORS, Failure, Received, Settler, read_delivery

__all__ = ["RunningWorker"]

log = logging.getLogger("rmqdelay.worker")
RECONNECT_FIRST_S = 0.5
"""The pause before the first reconnect, before jitter; it doubles with each failure."""
RECONNECT_MAX_S = 15.0
"""No reconnect pause is longer, jitter included (the README promises it)."""
_RECONNECT_DOUBLINGS = 16
"""Doublings past which the cap always wins: keeps ``2**failures`` a small float."""
PROBE_IDLE_S = 3.0
"""A session that has had no delivery for this long writes a probe (see ``_watch_node``)."""
PROBE_TIMEOUT_S = 5.0
"""How long a probe may wait for its confirm before the worker leaves that node."""
_CLOSE_S = 5.0


def reconnect_delay(failures: int, jitter: float) -> float:
    """The pause, in seconds, before the next connect; *failures* counts the failed
    connects in a row before the one that just failed (0 after the first).

    :data:`RECONNECT_FIRST_S` doubling each time, scaled by ``0.5 + jitter`` (*jitter*
    in [0, 1), so that many workers cut off together do not come back together), then
    capped: the cap comes after the jitter, so no pause exceeds :data:`RECONNECT_MAX_S`.
    """
    base = RECONNECT_FIRST_S * 2.0 ** min(failures, _RECONNECT_DOUBLINGS)
    return min(RECONNECT_MAX_S, base * (0.5 + jitter))


@dataclass
class _Session:
    """One connection's worth of state; a reconnect starts a new one."""

    connection: AbstractConnection
    channel: AbstractChannel
    publisher: AsyncPublisher
    settler: Settler
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    tail: JournalTail | None = None
    consumers: list[tuple[AbstractQueue, str]] = field(default_factory=list)
    active_at: float = field(default_factory=time.monotonic)
    """When a delivery last came, or a probe was last confirmed."""


class RunningWorker:
    """Consume the chosen work queues until stopped; reconnect when the connection drops."""

    def __init__(
        self,
        settings: Settings,
        handlers: list[HandlerSpec],
        *,
        concurrency: int = 8,
        prefetch: int | None = None,
        shutdown_timeout: float = 30.0,
    ) -> None:
        if not 1 <= concurrency <= 10_000:
            raise WorkerError(f"--concurrency must be from 1 to 10000, got {concurrency}")
        prefetch = concurrency if prefetch is None else prefetch
        if not 1 <= prefetch <= 65_535:
            raise WorkerError(f"--prefetch must be from 1 to 65535, got {prefetch}")
        if shutdown_timeout < 0:
            raise WorkerError(f"shutdown timeout must not be negative, got {shutdown_timeout}")
        self.settings = settings
        self.layout = settings.layout
        self.handlers = {spec.destination: spec for spec in handlers}
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.shutdown_timeout = shutdown_timeout
        self.ready = asyncio.Event()
        self.connects = 0
        self.abandoned = 0
        self.stop_signal: int | None = None
        self._stop = asyncio.Event()
        self._abort = asyncio.Event()
        self._slots = asyncio.Semaphore(concurrency)
        self._inflight: set[asyncio.Task[None]] = set()
        self._busy = 0
        self._executor = ThreadPoolExecutor(concurrency, thread_name_prefix="rmqdelay-handler")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._rng = random.Random()
        self.tombstones = Tombstones()
        self._expired_at_ms = 0
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
        return self._busy

    @property
    def exit_code(self) -> int:
        if self._abort.is_set():
            return 128 + (self.stop_signal or signal.SIGINT)
        return 0

    # ------------------------------------------------------------------ main loop

    async def run_until_signalled(self) -> int:
        """:meth:`run`, stopped by SIGTERM or SIGINT (gracefully, then at once)."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            loop.add_signal_handler(sig, self.signal, sig)
        try:
            return await self.run()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    async def run(self) -> int:
        """Consume until :meth:`stop`; return 0 after a graceful stop."""
        self._loop = asyncio.get_running_loop()
        failures = 0
        session: _Session | None = None
        try:
            while not self._stop.is_set():
                try:
                    session = await self._open()
                except WorkerError:
                    raise
                except aiormq.exceptions.ChannelAccessRefused as exc:
                    raise _refused(exc) from None  # a permission to grant: retrying won't help
                except (
                    ConnectionFailedError,
                    aiormq.exceptions.AMQPError,
                    OSError,
                    asyncio.TimeoutError,
                ) as exc:
                    if isinstance(exc, ConnectionFailedError) and not exc.transient:
                        raise WorkerError(str(exc)) from None
                    delay = reconnect_delay(failures, self._rng.random())
                    failures += 1
                    why = (
                        str(exc)
                        if isinstance(exc, ConnectionFailedError)
                        else f"starting on {self.settings.masked_url} failed "
                        f"({type(exc).__name__} {exc})"
                    )
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
                self.ready.set()
                log.info(
                    "consuming %s (concurrency %d, prefetch %d per queue)",
                    ", ".join(self.handlers),
                    self.concurrency,
                    self.prefetch,
                    extra={"url": self.settings.masked_url},
                )
                watch = asyncio.create_task(self._watch_node(session))
                await _first(self._stop.wait(), session.lost.wait())
                watch.cancel()
                if not self._stop.is_set():
                    self.ready.clear()
                    log.warning(
                        "lost the connection to %s; reconnecting (the broker redelivers "
                        "what was in flight)",
                        self.settings.masked_url,
                    )
                    await self._close(session)
                    session = None
                    await self._sleep_unless_stopped(0.2 + self._rng.random() * 0.3)
            await self._shutdown(session)
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)
        return self.exit_code

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _watch_node(self, session: _Session) -> None:
        """Leave a node cut off from the cluster's majority.

        Such a node keeps the connection, its heartbeats and the consumers, and delivers
        nothing: no ``basic.cancel``, no error (RabbitMQ 4.0.5, measured). What it cannot
        do is get a replicated write confirmed. So a session idle for ``PROBE_IDLE_S``
        appends a probe to the schedule journal; without its confirm within
        ``PROBE_TIMEOUT_S``, the session ends and the worker reconnects, that node last.
        Without the journal there is nothing to probe: no write a worker may make.
        """
        if not self.layout.journal:
            return
        while not session.lost.is_set():
            await asyncio.sleep(1.0)
            if time.monotonic() - session.active_at < PROBE_IDLE_S:
                continue
            try:
                await _bounded(write_probe(session.connection, self.layout), PROBE_TIMEOUT_S)
            except Exception as exc:  # no confirm, a nack, a closed channel: move
                if session.lost.is_set():
                    return
                address = address_of(session.connection)
                self._try_last = [address] if address else []
                log.warning(
                    "the node at %s did not confirm a write within %gs (%s): it may be cut "
                    "off from the cluster's majority; moving to another node",
                    mask_url(address or self.settings.masked_url),
                    PROBE_TIMEOUT_S,
                    type(exc).__name__,
                )
                session.lost.set()
                return
            session.active_at = time.monotonic()

    async def _open(self) -> _Session:
        connection = await connect_async(self.settings, "worker", last=self._try_last)
        try:
            lost = asyncio.Event()
            connection.close_callbacks.add(lambda *_: lost.set())
            queues = await self._check_queues(connection)
            tail = await self._follow_journal(connection, lost)
            channel = await connection.channel(publisher_confirms=False)
            channel.close_callbacks.add(lambda *_: lost.set())
            await channel.set_qos(prefetch_count=self.prefetch)
            park_channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            park_channel.close_callbacks.add(lambda *_: lost.set())
            park_exchange = await park_channel.get_exchange(self.layout.parking, ensure=False)
            publisher = await AsyncPublisher(self.settings, connection=connection).connect()
            settler = Settler(publisher, park_exchange, self.settings.confirm_timeout)
            session = _Session(connection, channel, publisher, settler, lost, tail)
            for destination, name in queues:
                queue = await channel.get_queue(name, ensure=False)
                spec = self.handlers[destination]
                try:
                    tag = await queue.consume(functools.partial(self._on_message, session, spec))
                except aiormq.exceptions.ChannelAccessRefused as exc:
                    raise _refused(exc, name, "read") from None
                session.consumers.append((queue, tag))
            return session
        except BaseException:
            with contextlib.suppress(Exception):
                await connection.close()
            raise

    async def _follow_journal(
        self, connection: AbstractConnection, lost: asyncio.Event
    ) -> JournalTail | None:
        """Read the journal's tombstones up to now before consuming, then follow it live.

        So a cancel confirmed before this worker (re)started is honoured too. Losing the
        journal's channel counts as losing the connection: cancels would go unseen.
        """
        if not self.layout.journal:
            return None
        tail = JournalTail(connection, self.layout, self.tombstones.add)
        try:
            await tail.start()
            await asyncio.wait_for(tail.caught_up.wait(), self.settings.confirm_timeout)
        except TopologyError as exc:
            raise WorkerError(str(exc)) from None
        except asyncio.TimeoutError:
            raise aiormq.exceptions.AMQPConnectionError(
                "the schedule journal was not read to its end in time"
            ) from None
        if tail.channel is not None:
            tail.channel.close_callbacks.add(lambda *_: lost.set())
        log.info(
            "schedule journal read: %d record(s), %d cancelled id(s) pending",
            tail.count,
            len(self.tombstones),
        )
        return tail

    async def _check_queues(self, connection: AbstractConnection) -> list[tuple[str, str]]:
        """Passive checks only, so a user without configure permission can run workers."""
        found = []
        for destination in self.handlers:
            name = self.layout.work_queue(destination)
            try:
                exists = await queue_exists_async(connection, name, self.settings.confirm_timeout)
            except AccessRefusedError as exc:
                raise WorkerError(
                    f"access to work queue {name!r} refused: the worker's user needs read "
                    f"permission on it and write permission on the {self.layout.prefix}.* "
                    f"exchanges ({exc.detail})"
                ) from None
            if not exists:
                raise WorkerError(
                    f"work queue {name!r} for handler {self.handlers[destination].name} does "
                    f"not exist: run `rmqdelay topology apply --destination {destination}` "
                    "(or check --prefix)"
                )
            found.append((destination, name))
        return found

    async def _shutdown(self, session: _Session | None) -> None:
        """Stop consuming, wait for in-flight handlers, then close."""
        if session is not None and not session.lost.is_set():
            for queue, tag in session.consumers:
                with contextlib.suppress(*SETTLE_ERRORS):
                    await queue.cancel(tag, timeout=5)
        pending = set(self._inflight)
        if pending and not self._abort.is_set():
            timeout = self.shutdown_timeout
            done_waiting = asyncio.ensure_future(asyncio.wait(pending, timeout=timeout))
            await _first(done_waiting, self._abort.wait())
            done_waiting.cancel()
        pending = {t for t in self._inflight if not t.done()}
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
            await self._close(session)
        log.info("stopped")

    async def _close(self, session: _Session) -> None:
        """Each step bounded: a node cut off from the majority may never answer a close."""
        closing = [session.publisher.close()]
        if session.tail is not None:
            closing.append(session.tail.close())
        closing.append(session.connection.close())
        for step in closing:
            with contextlib.suppress(Exception):
                await _bounded(step, _CLOSE_S)

    # ------------------------------------------------------------------ messages

    async def _on_message(
        self, session: _Session, spec: HandlerSpec, message: AbstractIncomingMessage
    ) -> None:
        # aiormq cancels its consumer tasks when the channel closes; ours must outlive
        # that, so a handler that is halfway is not cut off by a dropped connection.
        session.active_at = time.monotonic()
        task = asyncio.create_task(self._process(session, spec, message))
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _acquire_slot(self) -> bool:
        """Wait for a free handler slot; False when the worker stops first."""
        if self._stop.is_set():
            return False
        if not self._slots.locked():  # a free slot: take it without a task and a wait
            await self._slots.acquire()
            return True
        acquire = asyncio.ensure_future(self._slots.acquire())
        await _first(acquire, self._stop.wait())
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
        self, session: _Session, spec: HandlerSpec, message: AbstractIncomingMessage
    ) -> None:
        if not await self._acquire_slot():
            # Never started: give it back now, for another worker (nack, not reject).
            if not session.lost.is_set():
                with contextlib.suppress(*SETTLE_ERRORS):
                    await message.nack(requeue=True)
            return
        self._busy += 1
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
            self._busy -= 1
            self._slots.release()

    async def _handle(
        self, session: _Session, spec: HandlerSpec, message: AbstractIncomingMessage
    ) -> None:
        received = read_delivery(message)
        fields = {"destination": spec.destination, **received.fields}
        if self._is_cancelled(received):
            # cancelled through the journal: settle it without calling the handler
            await message.ack()
            log.info("cancelled", extra={**fields, "outcome": "cancelled"})
            HANDLED.labels(spec.destination, "cancelled").inc()
            return
        if received.lateness is not None:
            LATENESS.labels(spec.destination).observe(max(0.0, received.lateness.total_seconds()))
        log.debug("received", extra=fields)
        started = time.monotonic()
        failure: Failure | None = None
        try:
            value = spec.decoder(message.body, message.content_type)
            await self._call(session, spec, message, received, value, fields)
        except asyncio.CancelledError:
            raise
        except Failure as exc:
            failure = exc
        except BaseException as exc:  # every handler error has an outcome
            failure = Failure.of(exc)
        error = failure.error if failure is not None else None
        elapsed = time.monotonic() - started
        HANDLER_SECONDS.labels(spec.destination).observe(elapsed)
        fields["duration_ms"] = round(elapsed * 1000, 1)
        decision = decide(error, received.attempt, spec.policy, self._rng.random())
        await session.settler.settle(spec, message, received, decision, failure, fields)

    def _is_cancelled(self, received: Received) -> bool:
        """Whether a tombstone names this copy: its id and its due time (the header's),
        so a cancel skips every copy it named, and not a later re-schedule of the id."""
        now_ms = time.time_ns() // 10**6
        if now_ms - self._expired_at_ms > 60_000:  # forget tombstones past their time
            self.tombstones.expire(now_ms)
            self._expired_at_ms = now_ms
        due = received.due_at
        due_ms = None if due is None else round(due.timestamp() * 1000)
        return self.tombstones.is_cancelled(received.message_id, now_ms, due_ms)

    async def _call(
        self,
        session: _Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        received: Received,
        value: Any,
        fields: Mapping[str, Any],
    ) -> None:
        args: tuple[Any, ...] = (value,)
        if spec.wants_context:
            ctx = Context(
                message_id=received.message_id,
                destination=spec.destination,
                attempt=received.attempt,
                max_attempts=spec.policy.max_attempts,
                due_at=received.due_at,
                lateness=received.lateness,
                headers=received.headers,
                redelivered=bool(message.redelivered),
                body=message.body,
                content_type=message.content_type,
                correlation_id=message.correlation_id,
                logger=logging.LoggerAdapter(logging.getLogger("rmqdelay.handler"), dict(fields)),
                _publish=session.publisher.publish,
                _loop=self._loop,
            )
            args = (value, ctx)
        if spec.is_async:
            await spec.func(*args)
        else:
            assert self._loop is not None
            failure = await self._loop.run_in_executor(self._executor, _call_sync, spec.func, args)
            if failure is not None:
                raise failure


def _refused(
    exc: aiormq.exceptions.ChannelAccessRefused, queue: str | None = None, permission: str = ""
) -> WorkerError:
    """A refusal (403) as a permanent startup error naming the queue and the permission."""
    detail = str(exc.args[-1] if exc.args else exc)
    if queue is None:
        return WorkerError(
            f"the broker refused the worker's user: {detail}; grant it read permission on "
            "the work queues and the schedule stream, and write permission on the prefix's "
            "exchanges"
        )
    return WorkerError(
        f"the worker's user has no {permission} permission on work queue {queue!r}: grant "
        f"it (the {permission} pattern of `rabbitmqctl set_permissions` must match the "
        f"queue's name) ({detail})"
    )


def _call_sync(func: Callable[..., Any], args: tuple[Any, ...]) -> Failure | None:
    """Run a sync handler in a worker thread; return its failure instead of raising."""
    try:
        func(*args)
    except BaseException as exc:  # every handler error has an outcome
        return Failure.of(exc)
    return None


async def _bounded(step: Awaitable[Any], seconds: float) -> Any:
    """``step``'s value, or TimeoutError after ``seconds``. Unlike ``asyncio.wait_for``,
    never waits for the cancelled step to unwind: a channel close that a cut-off node
    never answers would hold that up until the partition ends."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait({task}, timeout=seconds)
    if not done:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise asyncio.TimeoutError(f"no answer within {seconds:g}s")
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Read a given-up step's outcome, so asyncio does not log it as never retrieved."""
    if not task.cancelled():
        task.exception()


async def _first(*awaitables: Any) -> None:
    """Wait until one of the awaitables finishes; cancel the rest (not futures passed in)."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    _done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task, original in zip(tasks, awaitables, strict=True):
        if task in pending and task is not original:
            task.cancel()
