"""A worker's part in keeping the journal's checkpoints: writing one when it is due.

Every :data:`CHECK_S` the worker looks at the checkpoint stream's last message (one
message): when the journal it read since the latest checkpoint outgrew an eighth of it
(:func:`~rmqdelay.core.journal.checkpoint.due_by_tail`), it writes the next one in a
process of its own (:func:`write_aside`), on a connection of its own
(:func:`~rmqdelay.amqp.checkpoints.write_checkpoint`); otherwise, every
:data:`~rmqdelay.core.journal.checkpoint.HEARTBEAT_MS`, it says it is alive, so that
publishers and commands know a writer runs. Several workers share the work: one that
finds another's checkpoint under way leaves it be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import socket
import subprocess
import sys
import uuid
from functools import partial
from typing import TYPE_CHECKING

from ..amqp.checkpoints import write_checkpoint
from ..amqp.journal import run_journal_async
from ..core.clock import now_ms
from ..core.journal.checkpoint import HEARTBEAT_MS, Mark, Pointer, due_by_tail
from ..core.journal.reading import latest
from ..core.journal.writer import Written, heartbeat
from ..settings import Settings

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection

    from ..amqp.journal import JournalTail

__all__ = ["CHECK_S", "CHILD_NICE", "Checkpointer", "write_aside", "writer_name"]

log = logging.getLogger("rmqdelay.worker")
CHECK_S = 30.0
"""How often a worker asks whether a checkpoint is due."""
CHILD_NICE = 10
"""The checkpoint's process yields the CPU to the worker's (and to a broker beside it)."""
_CHILD = (
    "import pickle, sys; path, job = pickle.load(sys.stdin.buffer); sys.path[:] = path; "
    "from rmqdelay.worker.checkpoints import _write_from; _write_from(job)"
)


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
            self._wrote(await write_aside(self.settings, self.name, pointer.id))
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


def _follows(pointer_id: str, mark: Mark | None) -> bool:
    """Still due: no checkpoint yet, or none written since the one it follows."""
    return mark is None or mark.latest.id == pointer_id


def _write(settings: Settings, writer: str, pointer_id: str) -> Written:
    return write_checkpoint(settings, writer=writer, due=partial(_follows, pointer_id))


async def write_aside(settings: Settings, writer: str, pointer_id: str) -> Written:
    """Write the checkpoint that follows ``pointer_id`` in a process of its own.

    Its folds and its encoding take seconds of CPU at a million pending. In a thread they
    held the worker's GIL against its event loop, which then woke 5 ms late at p50 and
    24 ms at p99 (200,000 pending, ``python -m bench.journal --only aside``). The child
    is a fresh interpreter (``python -c``, not ``multiprocessing``: no import of the
    user's ``__main__``) under ``nice -n`` :data:`CHILD_NICE`; the job, the settings
    with their secrets, goes over its stdin, never its command line. A thread waits for
    it, so a worker that stops lets the write end, as before. Where no process can be
    started it is written in that thread.
    """
    return await asyncio.to_thread(_write_in_child, settings, writer, pointer_id)


def _write_in_child(settings: Settings, writer: str, pointer_id: str) -> Written:
    job = pickle.dumps((list(sys.path), pickle.dumps((settings, writer, pointer_id))))
    try:
        if not sys.executable:
            raise OSError("sys.executable is empty")
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
    except OSError as exc:
        log.warning("checkpoint written in a thread: no process could be started (%s)", exc)
        return _write(settings, writer, pointer_id)
    out, _ = child.communicate(job)
    try:
        outcome, value = pickle.loads(out)
    except Exception:
        raise RuntimeError(
            f"the checkpoint's process ended with exit code {child.returncode}, no result"
        ) from None
    if outcome != "written" or not isinstance(value, Written):
        raise RuntimeError(str(value))
    return value


def _write_from(job: bytes) -> None:
    """The child's side of :func:`write_aside`: the result goes to stdout, pickled; what
    else would be printed there goes to stderr."""
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    with contextlib.suppress(OSError, AttributeError):  # no os.nice on Windows
        os.nice(CHILD_NICE)
    try:
        result: tuple[str, object] = ("written", _write(*pickle.loads(job)))
    except Exception as exc:  # its words, not the exception: it may not unpickle
        result = ("error", f"{type(exc).__name__}: {exc}")
    out.write(pickle.dumps(result))
    out.close()
