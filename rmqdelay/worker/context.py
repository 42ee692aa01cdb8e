"""What a handler learns about the message it handles, and how it publishes more.

In the worker, not the pure core: publishing from a sync handler hands a coroutine to
the worker's event loop from the handler's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aio_pika.abc import AbstractIncomingMessage
from typing_extensions import Unpack

from ..core import clock
from ..core.handling.handlers import HandlerSpec
from ..core.publishing.outgoing import PublishOptions, PublishResult
from .delivery import Delivery

__all__ = ["Context"]

_HANDLER_LOG = logging.getLogger("rmqdelay.handler")
PublishFn = Callable[..., Coroutine[Any, Any, PublishResult]]


@dataclass(frozen=True)
class Context:
    """The second parameter of a handler.

    ``attempt`` starts at 1 and grows with each retry; ``message_id`` stays the same
    across retries, so it is the key to deduplicate on (delivery is at least once).
    ``lateness`` is how long after its due time the handler started (None when the
    message carries no due time, e.g. it was not published by rmqdelay).

    Every field has a default, so a test can call a handler with ``Context(attempt=3)``.
    """

    message_id: str = "test-message"
    destination: str = ""
    attempt: int = 1
    max_attempts: int = 1
    due_at: datetime | None = None
    lateness: timedelta | None = None
    headers: Mapping[str, Any] = field(default_factory=dict)
    redelivered: bool = False
    body: bytes = field(default=b"", repr=False)
    content_type: str | None = None
    correlation_id: str | None = None
    logger: logging.LoggerAdapter[logging.Logger] = field(
        default_factory=lambda: logging.LoggerAdapter(logging.getLogger("rmqdelay.handler")),
        repr=False,
    )
    _publish: PublishFn | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)

    @property
    def lateness_ms(self) -> int | None:
        """``lateness`` in whole milliseconds, for logs and metrics."""
        return None if self.lateness is None else clock.ms_of_timedelta(self.lateness)

    @property
    def is_last_attempt(self) -> bool:
        """True when a failure now parks the message instead of retrying it."""
        return self.attempt >= self.max_attempts

    async def publish(
        self, destination: str, body: object, **options: Unpack[PublishOptions]
    ) -> PublishResult:
        """Publish a delayed message from an async handler and wait for its confirm.

        Takes the options of ``AsyncPublisher.publish`` (:class:`PublishOptions`).
        """
        if self._publish is None:
            raise RuntimeError("this Context has no publisher (it was built outside a worker)")
        return await self._publish(destination, body, **options)

    def publish_sync(
        self,
        destination: str,
        body: object,
        *,
        timeout: float | None = None,
        **options: Unpack[PublishOptions],
    ) -> PublishResult:
        """Publish from a sync handler (it runs in a worker thread) and wait for the confirm."""
        if self._publish is None or self._loop is None:
            raise RuntimeError("this Context has no publisher (it was built outside a worker)")
        if self._loop.is_running() and _on_loop_thread(self._loop):
            raise RuntimeError(
                "publish_sync() would block the event loop: use `await ctx.publish(...)` "
                "in an async handler"
            )
        future: concurrent.futures.Future[PublishResult] = asyncio.run_coroutine_threadsafe(
            self._publish(destination, body, **options), self._loop
        )
        return future.result(timeout)


def handler_context(
    spec: HandlerSpec,
    message: AbstractIncomingMessage,
    delivery: Delivery,
    publish: PublishFn,
    loop: asyncio.AbstractEventLoop | None,
) -> Context:
    """The context a worker gives ``spec``'s handler for this delivery."""
    return Context(
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
        logger=logging.LoggerAdapter(_HANDLER_LOG, delivery.fields),
        _publish=publish,
        _loop=loop,
    )


def _on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
