"""The x-delay bridge as a long-lived process: a :class:`Worker` with one handler and one
hook, so that it reconnects, fails over, drains on SIGTERM and honours cancels as any
worker does.

* **Stage 1**, the hook (:class:`Inbox`): on every connection it starts an
  :class:`~rmqdelay.bridge.inbox.InboxCarrier`, in a thread of its own or (``bridge
  run``'s default, ``inbox_process=True``) a process of its own (:func:`carry_in_process`:
  no GIL shared with stage 2, and a second share of a busy machine's cores), which takes
  the inbox in batches into the tiers with the public ``Publisher.publish_many``, acking
  only what was confirmed there and recorded in the schedule journal (so ``scheduled
  list`` and ``cancel`` work for bridged messages), and parks what it cannot schedule.
  Either way, it tells the session when its connection is lost: the worker then
  reconnects both stages.
* **Stage 2**, the handler (:meth:`Bridge.deliver`): when a copy falls due (and was not
  cancelled), it publishes the original message to ``DNAME`` (:class:`Outbox`) and
  returns; the Worker acks the copy after that.

A crash between a confirm and its ack sends a message again: duplicates, never loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import threading
from collections.abc import AsyncIterator, Iterable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from aio_pika.abc import AbstractConnection
from prometheus_client import Counter
from typing_extensions import Unpack

from ..amqp.connections import address_of, user_of
from ..amqp.passive import exchange_exists_async
from ..amqp.pika_private import mend_headers_in_this_thread
from ..core.handling.retry import Park
from ..errors import PublishError, WorkerError
from ..settings import Settings
from ..worker.app import RunOptions, Worker
from ..worker.context import Context
from ..worker.heap import freeze_startup_heap
from ..worker.hooks import WorkerHook
from ..worker.logs import configure_logging
from ..worker.runner import RunningWorker
from .envelope import unwrap
from .inbox import BATCH, PREFETCH, InboxCarrier
from .names import BridgeNames, bridge_names
from .outbox import Outbox

__all__ = ["BRIDGED", "Bridge", "Inbox", "carry_in_process"]

log = logging.getLogger("rmqdelay.bridge")

STOP_S = 4.0
"""How long a disconnect waits for stage 1's batch in hand (the worker gives a hook 5 s)."""
START_S = 30.0
"""How long stage 1's process may take to start (import, connect) beyond the confirm
timeout, before the session counts it as lost."""

BRIDGED = Counter(
    "rmqdelay_bridge_messages",
    "Messages the x-delay bridge took from its inbox, by exchange and outcome "
    "(scheduled: confirmed in the tiers; parked; requeued: given back to the inbox).",
    ["exchange", "outcome"],
)


class Inbox(WorkerHook):
    """Stage 1, started on each of the worker's connections (see the module docstring);
    also opens stage 2's :class:`Outbox` on that connection."""

    def __init__(
        self,
        settings: Settings,
        names: BridgeNames,
        prefetch: int = PREFETCH,
        batch: int = BATCH,
        *,
        process: bool = False,
        log_setup: tuple[str, str] | None = None,
    ) -> None:
        if not 1 <= prefetch <= 65_535:
            raise WorkerError(f"--inbox-prefetch must be from 1 to 65535, got {prefetch}")
        self.names = names
        self.settings = settings
        self.prefetch = prefetch
        self.batch = batch
        self.process = process
        self.log_setup = log_setup
        self.outbox: Outbox | None = None
        self._stage1: _Thread | _Child | None = None

    def count(self, outcome: str, n: int) -> None:
        if n:
            BRIDGED.labels(self.names.exchange, outcome).inc(n)

    async def on_connect(self, connection: AbstractConnection, lost: asyncio.Event) -> None:
        names, timeout = self.names, self.settings.confirm_timeout
        delivery = exchange_exists_async(connection, names.delivery_exchange)
        if not await asyncio.wait_for(delivery, timeout):
            raise WorkerError(
                f"the delivery exchange {names.delivery_exchange!r} does not exist: "
                f"run `{names.declare_command}`"
            )
        address = address_of(connection) or self.settings.urls[0]
        self.outbox = Outbox(connection, names, timeout, user_of(address))
        # stage 1 to the node the worker chose first (it leaves a node cut off from the
        # cluster's majority, and reconnects both)
        others = [url for url in self.settings.urls if url != address]
        start = _Child.start if self.process else _Thread.start
        self._stage1 = await start(self, others, lost)
        log.info(
            "bridge: %r -> inbox %r (stage 1 in %s) -> tiers (destination %s) -> %r",
            names.exchange,
            names.inbox,
            "a process of its own" if self.process else "a thread",
            names.destination,
            names.delivery_exchange,
        )

    async def on_disconnect(self) -> None:
        """Stop taking messages; the batch in hand finishes (up to ``STOP_S``), then the
        inbox connection closes and what was taken and not acked goes back."""
        stage1, self._stage1 = self._stage1, None
        if stage1 is not None:
            await asyncio.to_thread(stage1.stop, STOP_S)
        if self.outbox is not None:
            await self.outbox.close()


def _lost(loop: asyncio.AbstractEventLoop, lost: asyncio.Event, why: str) -> None:
    """End the session from stage 1's side: the worker reconnects both stages."""
    log.warning("bridge: the inbox's connection ended (%s); reconnecting", why)
    loop.call_soon_threadsafe(lost.set)


class _Thread:
    """Stage 1 in a thread of the bridge's process."""

    def __init__(self, carrier: InboxCarrier, thread: threading.Thread) -> None:
        self.carrier = carrier
        self.thread = thread

    @classmethod
    async def start(cls, inbox: Inbox, others: list[str], lost: asyncio.Event) -> _Thread:
        """Open it (raising what it could not open for), then start its thread."""
        carrier = InboxCarrier(
            inbox.settings,
            inbox.names,
            prefetch=inbox.prefetch,
            batch=inbox.batch,
            count=inbox.count,
            last=others,
        )
        await asyncio.to_thread(carrier.open)  # WorkerError, or a connection error: retried
        loop = asyncio.get_running_loop()
        thread = threading.Thread(
            target=carrier.carry_forever,
            args=(lambda exc: _lost(loop, lost, repr(exc)),),
            name="rmqdelay-bridge-inbox",
            daemon=True,
        )
        thread.start()
        return cls(carrier, thread)

    def stop(self, timeout: float) -> None:
        self.carrier.stop()
        self.thread.join(timeout)


class _Child:
    """Stage 1 in a process of its own (:func:`carry_in_process`), seen from the bridge:
    started, listened to (counts, a lost connection), stopped.

    Spawned, not forked: the bridge's process runs an event loop and threads, which a
    fork would copy in whatever state they were.
    """

    def __init__(self, process: BaseProcess, pipe: Connection) -> None:
        self.process = process
        self.pipe = pipe
        self._stopping = False
        self._listener: threading.Thread | None = None

    @classmethod
    async def start(cls, inbox: Inbox, others: list[str], lost: asyncio.Event) -> _Child:
        """Spawn it and wait until it consumes; raise what it could not start for."""
        context = multiprocessing.get_context("spawn")
        mine, theirs = context.Pipe()
        process = context.Process(
            target=carry_in_process,
            args=(
                inbox.settings,
                inbox.names,
                inbox.prefetch,
                inbox.batch,
                others,
                theirs,
                inbox.log_setup,
            ),
            name="rmqdelay-bridge-inbox",
            daemon=True,
        )
        process.start()
        theirs.close()
        child = cls(process, mine)
        timeout = inbox.settings.confirm_timeout + START_S
        try:
            first = await asyncio.to_thread(child._first, timeout)
        except BaseException:
            await asyncio.to_thread(child.stop, STOP_S)
            raise
        if first[0] != "ready":
            await asyncio.to_thread(child.stop, STOP_S)
            kind, text = (first[1], first[2]) if len(first) == 3 else ("lost", repr(first))
            if kind == "worker":
                raise WorkerError(str(text))
            raise ConnectionError(f"the bridge's inbox process could not start: {text}")
        loop = asyncio.get_running_loop()
        child._listener = threading.Thread(
            target=child._listen,
            args=(inbox, loop, lost),
            name="rmqdelay-bridge-inbox-pipe",
            daemon=True,
        )
        child._listener.start()
        return child

    def _first(self, timeout: float) -> tuple[object, ...]:
        if not self.pipe.poll(timeout):
            raise ConnectionError(f"the bridge's inbox process did not start in {timeout:g}s")
        try:
            message: tuple[object, ...] = self.pipe.recv()
        except EOFError:
            code = self.process.exitcode
            raise ConnectionError(f"the bridge's inbox process ended (exit code {code})") from None
        return message

    def _listen(self, inbox: Inbox, loop: asyncio.AbstractEventLoop, lost: asyncio.Event) -> None:
        """Counts into the metrics; a lost connection, or the process's end while it was
        not told to stop, ends the session."""
        why = "its process ended"
        try:
            while True:
                message = self.pipe.recv()
                if message[0] == "count":
                    inbox.count(str(message[1]), int(message[2]))
                elif message[0] == "lost":
                    why = str(message[1])
                    break
        except (EOFError, OSError):
            pass
        if not self._stopping:
            _lost(loop, lost, why)

    def stop(self, timeout: float) -> None:
        """Tell it to stop after its batch in hand; end it if it takes over ``timeout``."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self.pipe.send("stop")
        self.process.join(timeout)
        if self.process.is_alive():
            log.warning("bridge: the inbox's process did not stop in %gs; ending it", timeout)
            self.process.terminate()
            self.process.join(timeout)
        if self._listener is not None:  # the counts it sent before it ended are read
            self._listener.join(timeout)
        self.pipe.close()


def carry_in_process(
    settings: Settings,
    names: BridgeNames,
    prefetch: int,
    batch: int,
    last: list[str],
    pipe: Connection,
    log_setup: tuple[str, str] | None = None,
) -> None:
    """Stage 1 as a process of its own (the body of ``bridge run``'s inbox process).

    A thread of the bridge's process shares its GIL with stage 2's event loop: each
    waits for the other at every turn, and a loaded machine gives the one process one
    share of its cores. Here stage 1 has its own. Over ``pipe`` it says ``("ready",)``
    once consuming, or ``("error", kind, text)`` (``kind``: ``worker`` for what stops
    the worker, ``lost`` for what a reconnect may mend); then ``("count", outcome, n)``
    for every settled batch and ``("lost", text)`` if its connection ends. ``"stop"``
    from the parent, or the pipe's end (the parent died, even by ``kill -9``), stops it
    after the batch in hand: what it took and did not ack goes back to the inbox.
    """
    if log_setup is not None:
        level, fmt = log_setup
        configure_logging(
            level, "json" if fmt == "json" else "text", settings.url, settings.management_url
        )
    lock = threading.Lock()

    def say(*message: object) -> None:
        with lock, contextlib.suppress(OSError):
            pipe.send(message)

    carrier = InboxCarrier(
        settings,
        names,
        prefetch=prefetch,
        batch=batch,
        count=lambda outcome, n: say("count", outcome, n),
        last=last,
    )
    mend_headers_in_this_thread()  # before open: deliveries may come then
    try:
        carrier.open()
    except BaseException as exc:
        kind = "worker" if isinstance(exc, WorkerError) else "lost"
        say("error", kind, str(exc) or repr(exc))
        return

    def listen() -> None:
        with contextlib.suppress(EOFError, OSError):
            while pipe.recv() != "stop":
                pass
        carrier.stop()

    threading.Thread(target=listen, name="rmqdelay-bridge-inbox-pipe", daemon=True).start()
    freeze_startup_heap()
    say("ready")
    carrier.carry_forever(lambda exc: say("lost", repr(exc)))


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
