"""The worker application: handlers registered per destination, and how to run them.

``Worker`` is what a user writes (``@app.handler(...)``); :mod:`.runner` runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, TypedDict, TypeVar

from typing_extensions import Unpack

from ..core.handling.handlers import HandlerSpec, inspect_handler
from ..core.handling.retry import DEFAULT_BACKOFF, DEFAULT_MAX_ATTEMPTS, Backoff, RetryPolicy
from ..core.routing import validate_destination
from ..errors import ConfigurationError, RmqDelayError, WorkerError
from ..settings import Settings
from .context import Context
from .hooks import WorkerHook
from .runner import RunningWorker

__all__ = ["RunOptions", "Worker"]

F = TypeVar("F", bound=Callable[..., Any])


class RunOptions(TypedDict, total=False):
    """How a worker runs; the defaults are :class:`RunningWorker`'s."""

    concurrency: int
    prefetch: int | None
    shutdown_timeout: float
    consumer_timeout: float | None


class Worker:
    """A set of handlers, one per destination.

    ``app = Worker(settings)``, then ``@app.handler("orders-timeout")`` on functions,
    then ``rmqdelay worker module:app`` (or ``app.run()``). Without settings, the
    worker reads them from ``RMQDELAY_*`` when it starts. ``hooks`` observe every
    delivery (see :class:`WorkerHook`), after the worker's own.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: Backoff = DEFAULT_BACKOFF,
        retry_on: tuple[type[BaseException], ...] = (Exception,),
        park_on: tuple[type[BaseException], ...] = (),
        hooks: Iterable[WorkerHook] = (),
    ) -> None:
        self._settings = settings
        self.default_policy = RetryPolicy(max_attempts, backoff, tuple(retry_on), tuple(park_on))
        self.handlers: dict[str, HandlerSpec] = {}
        self.hooks: list[WorkerHook] = []
        for hook in hooks:
            self.add_hook(hook)

    def add_hook(self, hook: WorkerHook) -> WorkerHook:
        """Add a hook, called after those added before it."""
        if not isinstance(hook, WorkerHook):
            raise ConfigurationError(
                f"a hook must be a rmqdelay.WorkerHook (subclass it), got {type(hook).__name__}"
            )
        self.hooks.append(hook)
        return hook

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
        spec = inspect_handler(destination, func, policy, context=Context)
        self.handlers[destination] = spec
        return spec

    def select(self, settings: Settings, queues: Iterable[str] | None = None) -> list[HandlerSpec]:
        """The handlers to run: all, or those named by ``queues`` (destinations or queue names).

        Raises WorkerError naming the bad name, or ConfigurationError for a handler
        whose destination or backoff does not fit the settings.
        """
        layout = settings.layout
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
        handlers = self.select(settings, queues)
        return RunningWorker(settings, handlers, hooks=self.hooks, **options)

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
