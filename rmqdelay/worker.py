"""Workers: consume work queues, run handlers, and settle each message at least once.

The decisions live in :mod:`retry` (what to do), :mod:`handlers` (how to decode and
call) and :mod:`parking` (what a parked message carries); this module only does the
I/O, in this order: a message is acked after its handler returned, or after its
retry or parked copy was confirmed by the broker. Anything else leaves it unacked,
and the broker gives it back when the channel closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypedDict, TypeVar

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)
from pamqp.commands import Basic
from typing_extensions import Unpack

from .aio_publisher import AsyncPublisher
from .connections import connect_async
from .context import Context
from .errors import ConfigurationError, PublisherClosedError, PublishError, RmqDelayError
from .handlers import HandlerSpec, inspect_handler
from .layout import Layout
from .messages import ATTEMPT, DUE_AT
from .metrics import HANDLED, HANDLER_SECONDS, LATENESS
from .parking import header_int, kept_properties, parked_headers, short_traceback
from .retry import (
    DEFAULT_BACKOFF,
    DEFAULT_MAX_ATTEMPTS,
    Backoff,
    Decision,
    DecodeError,
    HandlerSignal,
    RetryPolicy,
    decide,
)
from .routing import validate_destination
from .settings import Settings

__all__ = ["RunningWorker", "Worker", "WorkerError"]

log = logging.getLogger("rmqdelay.worker")
F = TypeVar("F", bound=Callable[..., Any])
_RECONNECT_MAX_S = 15.0
_SETTLE_ERRORS = (
    aiormq.exceptions.AMQPError,
    aio_pika.exceptions.MessageProcessError,
    ConnectionError,
    asyncio.TimeoutError,
    RuntimeError,
)
_PARK_ERRORS = (aiormq.exceptions.PublishError, aiormq.exceptions.DeliveryError, PublishError)


class RunOptions(TypedDict, total=False):
    """How a worker runs; the defaults are :class:`RunningWorker`'s."""

    concurrency: int
    prefetch: int | None
    shutdown_timeout: float


class WorkerError(RmqDelayError):
    """The worker cannot run: a missing work queue, refused access, a bad queue name."""


class Worker:
    """A set of handlers, one per destination.

    ``app = Worker(settings)``, then ``@app.handler("orders-timeout")`` on functions,
    then ``rmqdelay worker module:app`` (or ``app.run()``). Without settings, the
    worker reads them from ``RMQDELAY_*`` when it starts.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: Backoff = DEFAULT_BACKOFF,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        park_on: tuple[type[BaseException], ...] = (),
    ) -> None:
        self._settings = settings
        self.default_policy = RetryPolicy(max_attempts, backoff, tuple(retry_on), tuple(park_on))
        self.handlers: dict[str, HandlerSpec] = {}

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = Settings()
        return self._settings

    def handler(
        self,
        destination: str,
        *,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        retry_on: tuple[type[BaseException], ...] | None = None,
        park_on: tuple[type[BaseException], ...] | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated function as the handler of ``destination``."""

        def register(func: F) -> F:
            self.add_handler(
                destination,
                func,
                max_attempts=max_attempts,
                backoff=backoff,
                retry_on=retry_on,
                park_on=park_on,
            )
            return func

        return register

    def add_handler(
        self,
        destination: str,
        func: Callable[..., Any],
        *,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        retry_on: tuple[type[BaseException], ...] | None = None,
        park_on: tuple[type[BaseException], ...] | None = None,
    ) -> HandlerSpec:
        """Register ``func`` for ``destination``; the same as the decorator."""
        if destination in self.handlers:
            raise ConfigurationError(
                f"destination {destination!r} already has handler "
                f"{self.handlers[destination].name}: one handler per destination"
            )
        base = self.default_policy
        policy = RetryPolicy(
            max_attempts=base.max_attempts if max_attempts is None else max_attempts,
            backoff=base.backoff if backoff is None else backoff,
            retry_on=base.retry_on if retry_on is None else tuple(retry_on),
            park_on=base.park_on if park_on is None else tuple(park_on),
        )
        spec = inspect_handler(destination, func, policy)
        self.handlers[destination] = spec
        return spec

    def select(self, settings: Settings, queues: Iterable[str] | None = None) -> list[HandlerSpec]:
        """The handlers to run: all, or those named by ``queues`` (destinations or queue names).

        Raises WorkerError naming the bad name, or ConfigurationError for a handler
        whose destination or backoff does not fit the settings.
        """
        layout = Layout.from_settings(settings)
        if not self.handlers:
            raise WorkerError("the worker has no handlers: decorate functions with @app.handler")
        chosen: list[str] = []
        for name in queues if queues is not None else self.handlers:
            name = name.strip()
            destination = layout.destination_of(name) or name
            if destination not in self.handlers:
                raise WorkerError(
                    f"no handler for queue {name!r}: this worker handles "
                    f"{', '.join(sorted(self.handlers))}"
                )
            chosen.append(destination)
        if not chosen:
            raise WorkerError("no queues selected: --queues was empty")
        specs = [self.handlers[d] for d in dict.fromkeys(chosen)]
        for spec in specs:
            try:
                validate_destination(layout, spec.destination)
            except RmqDelayError as exc:
                raise ConfigurationError(f"handler {spec.name}: {exc}") from None
            longest = spec.policy.backoff.longest_ms(spec.policy.max_attempts)
            if longest > layout.max_delay_ms:
                raise ConfigurationError(
                    f"handler {spec.name} for {spec.destination!r} can wait "
                    f"{longest}ms between attempts ({spec.policy.backoff.describe()}), over "
                    f"max_delay={layout.max_delay_ms}ms: lower its backoff max or raise max_delay"
                )
        return specs

    def runner(
        self,
        settings: Settings | None = None,
        *,
        queues: Iterable[str] | None = None,
        **options: Unpack[RunOptions],
    ) -> RunningWorker:
        """A :class:`RunningWorker` to ``await runner.run()`` yourself."""
        settings = settings or self.settings
        return RunningWorker(settings, self.select(settings, queues), **options)

    @contextlib.asynccontextmanager
    async def running(
        self,
        settings: Settings | None = None,
        *,
        queues: Iterable[str] | None = None,
        **options: Unpack[RunOptions],
    ) -> AsyncIterator[RunningWorker]:
        """Run in the background while the block runs, then stop gracefully (for tests)."""
        runner = self.runner(settings, queues=queues, **options)
        task = asyncio.create_task(runner.run())
        ready = asyncio.create_task(runner.ready.wait())
        await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            ready.cancel()
            task.result()  # raises the startup error
        try:
            yield runner
        finally:
            runner.stop()
            await task

    def run(
        self,
        settings: Settings | None = None,
        *,
        queues: Iterable[str] | None = None,
        **options: Unpack[RunOptions],
    ) -> int:
        """Run until SIGTERM or SIGINT; return the exit code (0 after a graceful stop).

        The first signal stops consuming and lets in-flight handlers finish (up to
        ``shutdown_timeout``); a second one stops at once.
        """
        runner = self.runner(settings, queues=queues, **options)
        return asyncio.run(runner.run_until_signalled())


@dataclass
class _Session:
    """One connection's worth of state; a reconnect starts a new one."""

    connection: AbstractConnection
    channel: AbstractChannel
    park_exchange: AbstractExchange
    publisher: AsyncPublisher
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    consumers: list[tuple[AbstractQueue, str]] = field(default_factory=list)


@dataclass
class _Received:
    """What the worker reads off a delivery before calling the handler."""

    message_id: str
    attempt: int
    due_at: datetime | None
    lateness: timedelta | None
    headers: dict[str, Any]

    @property
    def fields(self) -> dict[str, Any]:
        lateness = None if self.lateness is None else round(self.lateness.total_seconds() * 1000)
        return {"message_id": self.message_id, "attempt": self.attempt, "lateness_ms": lateness}


def _read(message: AbstractIncomingMessage) -> _Received:
    headers = dict(message.headers or {})
    due_ms = header_int(headers, DUE_AT, -1)
    due_at = lateness = None
    if due_ms >= 0:
        due_at = datetime.fromtimestamp(due_ms / 1000, tz=timezone.utc)
        lateness = timedelta(milliseconds=time.time() * 1000 - due_ms)
    return _Received(
        # A message without an id gets one here, which its retries then keep.
        message_id=message.message_id or str(uuid.uuid4()),
        attempt=max(1, header_int(headers, ATTEMPT, 1)),
        due_at=due_at,
        lateness=lateness,
        headers=headers,
    )


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
        self.layout = Layout.from_settings(settings)
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
                except aiormq.exceptions.ProbableAuthenticationError as exc:
                    raise WorkerError(
                        f"the broker refused the login to {self.settings.masked_url}: check "
                        f"the user and password ({type(exc).__name__})"
                    ) from None
                except (aiormq.exceptions.AMQPError, OSError, asyncio.TimeoutError) as exc:
                    delay = min(_RECONNECT_MAX_S, 0.5 * 2**failures) * (0.5 + self._rng.random())
                    failures += 1
                    log.warning(
                        "cannot connect to %s (%s); retrying in %.1fs",
                        self.settings.masked_url,
                        type(exc).__name__,
                        delay,
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
                await _first(self._stop.wait(), session.lost.wait())
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

    async def _open(self) -> _Session:
        connection = await connect_async(self.settings, "worker")
        try:
            lost = asyncio.Event()
            connection.close_callbacks.add(lambda *_: lost.set())
            queues = await self._check_queues(connection)
            channel = await connection.channel(publisher_confirms=False)
            channel.close_callbacks.add(lambda *_: lost.set())
            await channel.set_qos(prefetch_count=self.prefetch)
            park_channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            park_channel.close_callbacks.add(lambda *_: lost.set())
            park_exchange = await park_channel.get_exchange(self.layout.parking, ensure=False)
            publisher = await AsyncPublisher(self.settings, connection=connection).connect()
            session = _Session(connection, channel, park_exchange, publisher, lost)
            for destination, name in queues:
                queue = await channel.get_queue(name, ensure=False)
                spec = self.handlers[destination]
                tag = await queue.consume(functools.partial(self._on_message, session, spec))
                session.consumers.append((queue, tag))
            return session
        except BaseException:
            with contextlib.suppress(Exception):
                await connection.close()
            raise

    async def _check_queues(self, connection: AbstractConnection) -> list[tuple[str, str]]:
        """Passive checks only, so a user without configure permission can run workers."""
        found = []
        for destination in self.handlers:
            name = self.layout.work_queue(destination)
            try:
                async with connection.channel(publisher_confirms=False) as probe:
                    await probe.declare_queue(name, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                raise WorkerError(
                    f"work queue {name!r} for handler {self.handlers[destination].name} does "
                    f"not exist: run `rmqdelay topology apply --destination {destination}` "
                    "(or check --prefix)"
                ) from None
            except aiormq.exceptions.ChannelAccessRefused as exc:
                raise WorkerError(
                    f"access to work queue {name!r} refused: the worker's user needs read "
                    f"permission on it and write permission on the {self.layout.prefix}.* "
                    f"exchanges ({exc.args[-1] if exc.args else exc})"
                ) from None
            found.append((destination, name))
        return found

    async def _shutdown(self, session: _Session | None) -> None:
        """Stop consuming, wait for in-flight handlers, then close."""
        if session is not None and not session.lost.is_set():
            for queue, tag in session.consumers:
                with contextlib.suppress(*_SETTLE_ERRORS):
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
        with contextlib.suppress(Exception):
            await session.publisher.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(session.connection.close(), 5)

    # ------------------------------------------------------------------ messages

    async def _on_message(
        self, session: _Session, spec: HandlerSpec, message: AbstractIncomingMessage
    ) -> None:
        # aiormq cancels its consumer tasks when the channel closes; ours must outlive
        # that, so a handler that is halfway is not cut off by a dropped connection.
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
                with contextlib.suppress(*_SETTLE_ERRORS):
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
                with contextlib.suppress(*_SETTLE_ERRORS):
                    await message.reject(requeue=True)
        finally:
            self._busy -= 1
            self._slots.release()

    async def _handle(
        self, session: _Session, spec: HandlerSpec, message: AbstractIncomingMessage
    ) -> None:
        received = _read(message)
        fields = {"destination": spec.destination, **received.fields}
        if received.lateness is not None:
            LATENESS.labels(spec.destination).observe(max(0.0, received.lateness.total_seconds()))
        log.debug("received", extra=fields)
        started = time.monotonic()
        failure: _Failure | None = None
        try:
            value = spec.decoder(message.body, message.content_type)
            await self._call(session, spec, message, received, value, fields)
        except asyncio.CancelledError:
            raise
        except _Failure as exc:
            failure = exc
        except BaseException as exc:  # every handler error has an outcome
            failure = _Failure.of(exc)
        error = failure.error if failure is not None else None
        elapsed = time.monotonic() - started
        HANDLER_SECONDS.labels(spec.destination).observe(elapsed)
        fields["duration_ms"] = round(elapsed * 1000, 1)
        decision = decide(error, received.attempt, spec.policy, self._rng.random())
        await self._settle(session, spec, message, received, decision, failure, fields)

    async def _call(
        self,
        session: _Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        received: _Received,
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

    async def _settle(
        self,
        session: _Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        received: _Received,
        decision: Decision,
        failure: _Failure | None,
        fields: dict[str, Any],
    ) -> None:
        destination = spec.destination
        try:
            if decision.action == "ack":
                await message.ack()
                log.info("handled", extra={**fields, "outcome": "acked"})
                HANDLED.labels(destination, "acked").inc()
            elif decision.action == "requeue":
                await message.reject(requeue=True)
                log.info("requeued", extra={**fields, "outcome": "requeued"})
                HANDLED.labels(destination, "requeued").inc()
            elif decision.action == "retry":
                try:
                    await self._republish(session, spec, message, received, decision)
                except PublisherClosedError as exc:
                    log.warning("the retry was not confirmed (%s); requeueing", exc, extra=fields)
                    await message.reject(requeue=True)
                    return
                except RmqDelayError as exc:  # unroutable, nacked, or a delay over max_delay
                    reason = f"{decision.reason}; the retry could not be published: {exc}"
                    decision = Decision("park", received.attempt, reason=reason)
                else:
                    await message.ack()
                    log.warning(
                        "retrying",
                        extra={
                            **fields,
                            "outcome": "retried",
                            "delay_ms": decision.delay_ms,
                            "reason": decision.reason,
                        },
                    )
                    HANDLED.labels(destination, "retried").inc()
                    return
            if decision.action == "park":
                await self._park(session, spec, message, received, decision, failure, fields)
        except _SETTLE_ERRORS as exc:
            log.warning(
                "could not settle the message (%s): the broker redelivers it",
                type(exc).__name__,
                extra=fields,
            )

    async def _republish(
        self,
        session: _Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        received: _Received,
        decision: Decision,
    ) -> None:
        """Send the message round the delay tiers again, as the next attempt."""
        # prepare() strips x-death and friends: the dead-letter cycle trap lives there
        headers = {**received.headers, ATTEMPT: decision.attempt}
        headers.pop("x-delivery-count", None)  # the broker's, for the old delivery
        prepared = session.publisher.core.prepare(
            spec.destination,
            message.body,
            delay=timedelta(milliseconds=decision.delay_ms),
            headers=headers,
            message_id=received.message_id,
            **kept_properties(message),
        )
        await session.publisher.send(prepared)

    async def _park(
        self,
        session: _Session,
        spec: HandlerSpec,
        message: AbstractIncomingMessage,
        received: _Received,
        decision: Decision,
        failure: _Failure | None,
        fields: dict[str, Any],
    ) -> None:
        """Publish a copy to the parking queue, confirmed, then ack the original."""
        headers = parked_headers(
            received.headers,
            reason=decision.reason,
            destination=spec.destination,
            attempts=received.attempt,
            parked_at_ms=time.time_ns() // 1_000_000,
            error=failure.error if failure is not None else None,
            trace=failure.trace if failure is not None else None,
        )
        copy = aio_pika.Message(
            message.body,
            headers=headers,
            content_type=message.content_type,
            content_encoding=message.content_encoding,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            priority=message.priority,
            correlation_id=message.correlation_id,
            reply_to=message.reply_to,
            message_id=received.message_id,
            timestamp=message.timestamp,
            type=message.type,
            app_id=message.app_id,
        )
        extra = {**fields, "outcome": "parked", "reason": decision.reason}
        try:
            confirm = await session.park_exchange.publish(
                copy, routing_key="", mandatory=True, timeout=self.settings.confirm_timeout
            )
            if isinstance(confirm, Basic.Nack):
                raise PublishError("the broker nacked the parked copy")
        except _PARK_ERRORS as exc:
            log.error(
                "could not park the message (%s); it goes back to the queue",
                exc,
                extra=extra,
            )
            await asyncio.sleep(1)  # do not spin on a broken parking queue
            await message.reject(requeue=True)
            return
        await message.ack()
        if failure is not None and not isinstance(failure.error, HandlerSignal):
            extra["traceback"] = failure.trace
        log.error("parked", extra=extra)
        HANDLED.labels(spec.destination, "parked").inc()


class _Failure(Exception):
    """A handler's exception with its traceback text, taken where the frames still are.

    An exception raised in a thread comes out of ``run_in_executor`` without the
    handler's frames, so sync handlers format theirs in the thread.
    """

    def __init__(self, error: BaseException, trace: str | None) -> None:
        super().__init__(error)
        self.error, self.trace = error, trace

    @classmethod
    def of(cls, error: BaseException) -> _Failure:
        # A body that did not decode has no handler frames worth showing.
        return cls(error, None if isinstance(error, DecodeError) else short_traceback(error))


def _call_sync(func: Callable[..., Any], args: tuple[Any, ...]) -> _Failure | None:
    """Run a sync handler in a worker thread; return its failure instead of raising."""
    try:
        func(*args)
    except BaseException as exc:  # every handler error has an outcome
        return _Failure.of(exc)
    return None


async def _first(*awaitables: Any) -> None:
    """Wait until one of the awaitables finishes; cancel the rest (not futures passed in)."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    _done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task, original in zip(tasks, awaitables, strict=True):
        if task in pending and task is not original:
            task.cancel()
