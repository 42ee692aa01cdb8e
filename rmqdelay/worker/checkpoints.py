"""A worker's part in keeping the journal's checkpoints: writing one when it is due.

Every :data:`CHECK_S` the worker looks at the checkpoint stream's last message (one
message): when the journal it read since the latest checkpoint outgrew an eighth of it
(:func:`~rmqdelay.core.journal.checkpoint.due_by_tail`), it writes the next one in a
process of its own, on a connection of its own
(:func:`~rmqdelay.amqp.checkpoints.write_in_child`): a thread waits for it, so the fold
never holds the worker's GIL against its event loop; otherwise, every
:data:`~rmqdelay.core.journal.checkpoint.HEARTBEAT_MS`, it says it is alive, so that
publishers and commands know a writer runs. Several workers share the work: one that
finds another's checkpoint under way leaves it be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from typing import TYPE_CHECKING

from ..amqp.checkpoints import write_in_child
from ..amqp.journal import run_journal_async
from ..core.clock import now_ms
from ..core.journal.checkpoint import HEARTBEAT_MS, Mark, Pointer, due_by_tail
from ..core.journal.reading import latest
from ..core.journal.writer import Written, heartbeat
from ..settings import Settings

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

    from ..amqp.journal import JournalTail

__all__ = ["CHECK_S", "Checkpointer", "writer_name"]

log = logging.getLogger("rmqdelay.worker")
CHECK_S = 30.0
"""How often a worker asks whether a checkpoint is due."""


def writer_name() -> str:
    """This process's name in the checkpoints it writes: host, process, a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Checkpointer:
    """Writes checkpoints when due, from a task alongside the worker's tail."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.name = writer_name()
        self.written: list[Written] = []
        """What this worker wrote (the latest last; a few kept)."""
        self._task: asyncio.Task[None] | None = None
        self._alive_ms = 0

    def start(self, connection: AbstractConnection, tail: JournalTail, pointer: Pointer) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._loop(connection, tail, pointer))

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _loop(
        self, connection: AbstractConnection, tail: JournalTail, began: Pointer
    ) -> None:
        while True:
            await asyncio.sleep(CHECK_S)
            try:
                await self.check(connection, tail, began)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed check is tried again at the next
                log.warning("checkpoint not written: %s", exc)

    async def check(
        self, connection: AbstractConnection, tail: JournalTail, began: Pointer
    ) -> None:
        """Write a checkpoint if one is due, or say this worker is alive."""
        timeout = self.settings.confirm_timeout
        found = await run_journal_async(latest(self.layout, timeout), connection)
        if found == "missing":
            return  # a journal declared before checkpoints: topology apply adds the stream
        mark = found if isinstance(found, Mark) else None
        now = now_ms()
        if mark is not None and mark.busy(now):
            return
        pointer = mark.latest if mark is not None else began
        if pointer.covers is not None and pointer.covers >= (tail.first or 0):
            tail_bytes = tail.bytes_since(pointer.covers)
        else:
            tail_bytes = tail.bytes  # read from before what the latest one covers
        if due_by_tail(pointer, tail_bytes, self.layout.journal_retention):
            written = await asyncio.to_thread(write_in_child, self.settings, self.name, pointer.id)
            self._wrote(written)
        elif now - self._alive_ms >= HEARTBEAT_MS:
            await run_journal_async(
                heartbeat(self.layout, mark, writer=self.name, clock=now_ms), connection
            )
            self._alive_ms = now

    def _wrote(self, written: Written) -> None:
        if written.outcome != "written" or written.pointer is None:
            return
        self.written = [*self.written[-4:], written]
        self._alive_ms = now_ms()
        log.info(
            "checkpoint %s written: %d bytes, covering the journal to offset %s (a tail of "
            "%d bytes folded)",
            written.pointer.id,
            written.pointer.bytes,
            written.pointer.covers,
            written.tail_bytes,
        )
        if written.gap_text is not None:
            log.error("%s", written.gap_text)
