"""Hooks around handling, dramatiq's middleware as the model.

The worker decides what to do with a delivery and tells the broker; hooks observe it
(metrics, logs, your own), and one may skip a delivery before its handler runs (the
schedule journal's cancel filter), or admit it after an await of its own (the keys
filter claims a keyed copy in the journal first). A hook that raises is logged and
passed over: the message is still settled exactly once, and the other hooks still run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .delivery import Delivery

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

    from ..amqp.aio_publisher import AsyncPublisher

__all__ = ["HANDLE", "Admission", "Hooks", "Outcome", "Settled", "WorkerHook"]

log = logging.getLogger("rmqdelay.worker")

Outcome = Literal[
    "acked", "retried", "requeued", "parked", "cancelled", "dropped", "forwarded", "returned"
]
OnSuccess = Callable[[], Awaitable[None]]
"""Run after the handler returned and before the ack (the keys filter's ``done`` record)."""


@dataclass(frozen=True)
class Admission:
    """What :meth:`WorkerHook.admit` says of a delivery.

    - ``handle``: call the handler; then each ``on_success`` in turn, once it returned
      and before the ack (one that raises is logged, and the message is still acked:
      its handler ran).
    - ``drop``: ack it without calling the handler (outcome ``dropped``, ``reason`` says
      why: a duplicate, a key's loser, ...).
    - ``forward``: publish the same message again (id, body, headers, attempt) due at
      ``forward_due_ms``, confirmed, then ack this copy (outcome ``forwarded``).
    - ``requeue``: the hook cannot tell now (the journal did not answer in time): back
      to its queue after a pause, unhandled (outcome ``requeued``).
    """

    action: Literal["handle", "drop", "forward", "requeue"]
    reason: str = ""
    forward_due_ms: int | None = None
    on_success: tuple[OnSuccess, ...] = ()


HANDLE = Admission("handle")
"""Handle it, nothing else to do."""


@dataclass(frozen=True)
class Settled:
    """How a delivery ended, as the broker was told.

    ``outcome``: ``acked`` (the handler returned), ``retried`` (a copy for the next
    attempt confirmed, then acked), ``requeued``, ``parked``, ``cancelled`` (a hook
    skipped it: acked, never handled), ``dropped`` (a hook's admission dropped it:
    acked, never handled, ``reason`` says why), ``forwarded`` (a copy due later
    confirmed, then acked, not handled), or ``returned``: settling failed, the broker
    delivers it again, and ``problem`` says why.
    """

    outcome: Outcome
    reason: str = ""
    delay_ms: int | None = None
    """The wait before the next attempt, for ``retried``."""
    error: BaseException | None = None
    """What the handler raised, if it did."""
    traceback: str | None = None
    """The handler's last frames, for a parked error (not for a ``Park`` it raised)."""
    seconds: float | None = None
    """How long the handler ran; None when it did not run."""
    problem: str | None = None


class WorkerHook:
    """Subclass and override what you need; a method left alone is never called.

    The per-delivery methods run on the worker's event loop, for every message: keep them
    quick and never block.
    """

    async def on_connect(self, connection: AbstractConnection, lost: asyncio.Event) -> None:
        """A connection is open and consuming has not started; set ``lost`` to end it.

        Raising fails the start: a connection error is retried with the reconnect
        pauses, anything else stops the worker.
        """

    async def on_disconnect(self) -> None:
        """That connection's session ended (lost, or the worker stops)."""

    def before_handle(self, delivery: Delivery) -> bool:
        """True to ack the delivery without calling its handler (outcome ``cancelled``);
        the hooks after this one are then not asked."""
        return False

    def admit(
        self,
        delivery: Delivery,
        message: AbstractIncomingMessage,
        publisher: AsyncPublisher,
    ) -> Awaitable[Admission] | None:
        """Asked after ``before_handle``, in order, once a handler slot is taken: None
        lets the delivery through and costs nothing more (return it quickly for the
        deliveries you do not care about); an awaitable's :class:`Admission` says what
        to do. ``publisher`` is the session's, for a hook that must publish first (its
        confirm awaited before the handler runs). A ``drop`` or ``forward`` ends the
        asking; the hooks after it are not asked."""
        return None

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        """The broker has been told how the delivery ended (or settling failed)."""


class Hooks:
    """A worker's hooks in order; each method is called only on hooks that override it."""

    def __init__(self, hooks: Iterable[WorkerHook]) -> None:
        self.all = tuple(hooks)
        self._connect = _overriding(self.all, "on_connect")
        self._disconnect = _overriding(self.all, "on_disconnect")
        self._before = _overriding(self.all, "before_handle")
        self._after = _overriding(self.all, "after_settle")
        self.admitting = _overriding(self.all, "admit")
        """The hooks with an ``admit``: none, and the worker does not ask."""

    async def connect(self, connection: AbstractConnection, lost: asyncio.Event) -> None:
        for hook in self._connect:
            await hook.on_connect(connection, lost)

    async def disconnect(self) -> None:
        for hook in self._disconnect:
            try:
                await hook.on_disconnect()
            except Exception:
                log.exception("hook %s failed in on_disconnect", _name(hook))

    def skip(self, delivery: Delivery) -> bool:
        """Whether a hook skips the delivery; a hook that fails skips nothing (at least once)."""
        for hook in self._before:
            try:
                if hook.before_handle(delivery):
                    return True
            except Exception:
                log.exception(
                    "hook %s failed in before_handle; the message is handled",
                    _name(hook),
                    extra=delivery.fields,
                )
        return False

    def admit(
        self, delivery: Delivery, message: AbstractIncomingMessage, publisher: AsyncPublisher
    ) -> Awaitable[Admission] | None:
        """None when no admitting hook has a say (the usual delivery: no coroutine, no
        await); otherwise what they say, in order. A hook that fails says ``handle``
        (at least once)."""
        for index, hook in enumerate(self.admitting):
            pending = self._ask(hook, delivery, message, publisher)
            if pending is not None:
                return self._admit_from(index, pending, delivery, message, publisher)
        return None

    def _ask(
        self,
        hook: WorkerHook,
        delivery: Delivery,
        message: AbstractIncomingMessage,
        publisher: AsyncPublisher,
    ) -> Awaitable[Admission] | None:
        try:
            return hook.admit(delivery, message, publisher)
        except Exception:
            self._failed(hook, delivery)
            return None

    async def _admit_from(
        self,
        index: int,
        pending: Awaitable[Admission] | None,
        delivery: Delivery,
        message: AbstractIncomingMessage,
        publisher: AsyncPublisher,
    ) -> Admission:
        on_success: tuple[OnSuccess, ...] = ()
        hooks = self.admitting
        while True:
            if pending is not None:
                try:
                    admission = await pending
                except Exception:
                    self._failed(hooks[index], delivery)
                else:
                    if admission.action != "handle":
                        return admission
                    on_success += admission.on_success
            index += 1
            if index >= len(hooks):
                break
            pending = self._ask(hooks[index], delivery, message, publisher)
        return Admission("handle", on_success=on_success) if on_success else HANDLE

    @staticmethod
    def _failed(hook: WorkerHook, delivery: Delivery) -> None:
        log.exception(
            "hook %s failed in admit; the message is handled", _name(hook), extra=delivery.fields
        )

    def settled(self, delivery: Delivery, settled: Settled) -> None:
        for hook in self._after:
            try:
                hook.after_settle(delivery, settled)
            except Exception:
                log.exception("hook %s failed in after_settle", _name(hook), extra=delivery.fields)


def _overriding(hooks: tuple[WorkerHook, ...], method: str) -> tuple[WorkerHook, ...]:
    default = getattr(WorkerHook, method)
    return tuple(h for h in hooks if getattr(type(h), method, default) is not default)


def _name(hook: WorkerHook) -> str:
    return type(hook).__qualname__
