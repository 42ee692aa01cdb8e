"""The x-delay bridge as a long-lived process: a :class:`Worker` with one handler and one
hook, so that it reconnects, fails over, drains on SIGTERM and honours cancels as any
worker does.

* **Stage 1**, the hook (:class:`~rmqdelay.bridge.hook.Inbox`): on every connection it
  starts an :class:`~rmqdelay.bridge.inbox.InboxCarrier`, in a thread or a process of its
  own, which takes the inbox in batches into the tiers with the public
  ``Publisher.publish_many``, acking only what was confirmed there and recorded in the
  schedule journal (so ``scheduled list`` and ``cancel`` work for bridged messages), and
  parks what it cannot schedule.
* **Stage 2**, the handler (:meth:`Bridge.deliver`): when a copy falls due (and was not
  cancelled), it publishes the original message to ``DNAME`` (confirms, mandatory:
  :class:`~rmqdelay.bridge.outbox.Outbox`) and returns; the Worker acks the copy after
  that. A message no queue at ``DNAME`` takes is parked with the reason (the plugin
  dropped it; ``parked replay`` sends it again once a queue is bound); a nack is retried
  through the tiers, as any handler's failure.

A crash between a confirm and its ack sends a message again: duplicates, never loss.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable

from typing_extensions import Unpack

from ..core.retry import Park
from ..errors import PublishError
from ..settings import Settings
from ..worker.app import RunOptions, Worker
from ..worker.context import Context
from ..worker.hooks import WorkerHook
from ..worker.runner import RunningWorker
from .envelope import unwrap
from .hook import Inbox
from .inbox import BATCH, PREFETCH
from .names import bridge_names

__all__ = ["Bridge"]


class Bridge:
    """One x-delay bridge: ``NAME`` (publishers, ``x-delay``) to ``DNAME`` (consumers).

    ``Bridge(settings, "orders").run()`` runs until SIGTERM; several processes share the
    inbox and the destination's work queue as competing consumers. ``hooks`` observe
    stage 2 as a worker's hooks do. ``inbox_process``: stage 1 in a spawned process of its
    own, as ``rmqdelay bridge run`` does by default (the calling script then needs the
    usual ``if __name__ == "__main__":`` guard); else a thread. ``log_setup``: the
    (level, format) that process logs with (the CLI's ``--log-level``, ``--log-format``).
    """

    def __init__(
        self,
        settings: Settings,
        exchange: str,
        *,
        delivery_exchange: str | None = None,
        destination: str | None = None,
        inbox_prefetch: int = PREFETCH,
        batch: int = BATCH,
        hooks: Iterable[WorkerHook] = (),
        inbox_process: bool = False,
        log_setup: tuple[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.names = bridge_names(
            settings.layout, exchange, delivery_exchange=delivery_exchange, destination=destination
        )
        self.inbox = Inbox(
            settings, self.names, inbox_prefetch, batch, process=inbox_process, log_setup=log_setup
        )
        self.worker = Worker(settings, hooks=[self.inbox, *hooks])
        self.worker.add_handler(self.names.destination, self.deliver)

    async def deliver(self, body: bytes, ctx: Context) -> None:
        """Stage 2: publish the original message to ``DNAME``, confirmed."""
        try:
            restored = unwrap(body, ctx.message_id)
        except ValueError as exc:
            raise Park(str(exc)) from None
        outbox = self.inbox.outbox
        if outbox is None:
            raise PublishError("the bridge is not connected")
        await outbox.send(restored)

    def runner(self, **options: Unpack[RunOptions]) -> RunningWorker:
        return self.worker.runner(self.settings, **options)

    @contextlib.asynccontextmanager
    async def running(self, **options: Unpack[RunOptions]) -> AsyncIterator[RunningWorker]:
        """Run in the background while the block runs, then stop gracefully (for tests)."""
        async with self.worker.running(self.settings, **options) as runner:
            yield runner

    def run(self, **options: Unpack[RunOptions]) -> int:
        """Run until SIGTERM or SIGINT, as ``rmqdelay bridge run`` does; the exit code."""
        return self.worker.run(self.settings, **options)
