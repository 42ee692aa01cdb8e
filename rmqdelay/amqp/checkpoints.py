"""Checkpoints written on pika, each on a connection of its own: by a worker's thread,
a publisher's (when no writer runs) and ``rmqdelay scheduled checkpoint``. What a
checkpoint is and how it is written is :mod:`rmqdelay.core.journal.writer`'s."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..core.clock import now_ms
from ..core.journal.checkpoint import Mark
from ..core.journal.writer import Written, write
from ..core.steps import Checkpoint
from ..settings import Settings
from .journal import read_once

__all__ = ["CHECKPOINT_READ_TIMEOUT_S", "checkpoint_aside", "write_checkpoint"]

log = logging.getLogger("rmqdelay.publisher")

CHECKPOINT_READ_TIMEOUT_S = 60.0
"""How long a checkpoint's writer waits for a stream to give the next message."""


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
