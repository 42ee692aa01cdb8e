"""Checkpoints written on pika, each on a connection of its own: by a worker's child
process (:func:`write_in_child`), a publisher's thread (when no writer runs) and
``rmqdelay scheduled checkpoint``. What a checkpoint is and how it is written is
:mod:`rmqdelay.core.journal.writer`'s."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from functools import partial

from ..core.clock import now_ms
from ..core.journal.checkpoint import Mark
from ..core.journal.writer import Written, write
from ..core.steps import Checkpoint
from ..settings import Settings
from .journal import read_once

__all__ = [
    "CHECKPOINT_READ_TIMEOUT_S",
    "CHILD_NICE",
    "checkpoint_aside",
    "write_checkpoint",
    "write_in_child",
]

log = logging.getLogger("rmqdelay.publisher")

CHECKPOINT_READ_TIMEOUT_S = 60.0
"""How long a checkpoint's writer waits for a stream to give the next message."""
CHILD_NICE = 10
"""A worker's checkpoint process yields the CPU to the worker (and a broker beside it)."""
_CHILD = (
    "import pickle, sys; path, job = pickle.load(sys.stdin.buffer); sys.path[:] = path; "
    "from rmqdelay.amqp.checkpoints import _write_from; _write_from(job)"
)


def write_checkpoint(
    settings: Settings,
    *,
    writer: str,
    due: Callable[[Mark | None], bool] = lambda _mark: True,
) -> Written:
    """Write a checkpoint on a connection of its own, closed after."""
    timeout = max(settings.confirm_timeout, CHECKPOINT_READ_TIMEOUT_S)
    flow = write(settings.layout, writer=writer, timeout=timeout, clock=now_ms, due=due)
    return read_once(settings, flow, name="checkpoint")


def checkpoint_aside(settings: Settings, step: Checkpoint) -> None:
    """A publisher's :class:`~rmqdelay.core.steps.Checkpoint`, in the thread it runs it
    on: written, or the reason it was not logged (the publish it followed stands)."""
    try:
        written = write_checkpoint(settings, writer=step.writer, due=step.due)
    except Exception as exc:  # a later publish tries again
        log.warning("no checkpoint written after this publish: %s", exc)
        return
    if written.pointer is not None:
        log.info("no writer for a while: this publisher wrote checkpoint %s", written.pointer.id)
    if written.gap_text is not None:
        log.error("%s", written.gap_text)


def _follows(pointer_id: str, mark: Mark | None) -> bool:
    """Still due: no checkpoint yet, or none written since the one it follows."""
    return mark is None or mark.latest.id == pointer_id


def _write(settings: Settings, writer: str, pointer_id: str) -> Written:
    return write_checkpoint(settings, writer=writer, due=partial(_follows, pointer_id))


def write_in_child(settings: Settings, writer: str, pointer_id: str) -> Written:
    """Write the checkpoint that follows ``pointer_id`` in a process of its own.

    Its folds and its encoding take seconds of CPU at a million pending. In a thread they
    held the worker's GIL against its event loop, which then woke 5 ms late at p50 and
    24 ms at p99 (200,000 pending, ``python -m bench.journal --only aside``). The child
    is a fresh interpreter (``python -c``, not ``multiprocessing``: no import of the
    user's ``__main__``) under ``nice -n`` :data:`CHILD_NICE`; the job, the settings
    with their secrets, goes over its stdin, never its command line. The worker waits
    for it in a thread, so one that stops lets the write end, as before. Where no
    process can be started it is written in the calling thread.
    """
    import pickle  # here: a publisher imports this module, and never needs it

    job = pickle.dumps((list(sys.path), pickle.dumps((settings, writer, pointer_id))))
    try:
        if not sys.executable:
            raise OSError("sys.executable is empty")
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
    except OSError as exc:
        log.warning("checkpoint written in this process: none could be started (%s)", exc)
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
    """The child's side of :func:`write_in_child`: the result goes to stdout, pickled; what
    else would be printed there goes to stderr. It logs nothing: the worker logs what it
    returns, through the worker's logging, which masks every password."""
    import pickle

    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    logging.disable(logging.CRITICAL)
    with contextlib.suppress(OSError, AttributeError):  # no os.nice on Windows
        os.nice(CHILD_NICE)
    try:
        result: tuple[str, object] = ("written", _write(*pickle.loads(job)))
    except Exception as exc:  # its words, not the exception: it may not unpickle
        result = ("error", f"{type(exc).__name__}: {exc}")
    out.write(pickle.dumps(result))
    out.close()
