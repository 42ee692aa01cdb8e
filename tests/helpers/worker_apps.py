"""Worker apps the subprocess tests run with ``rmqdelay worker tests.helpers.worker_apps:app``.

Settings come from ``RMQDELAY_*``. Each handler appends ``event message_id attempt pid``
lines to ``$WORKER_TEST_LOG`` (one ``write`` each, so lines survive SIGKILL whole) and
sleeps ``$WORKER_TEST_SLEEP`` seconds in between. The handlers' destinations are
``$WORKER_TEST_BATCH`` and ``$WORKER_TEST_SLOW`` (default ``batch`` and ``slow``), so that
each test can have its own on a shared topology.
"""

from __future__ import annotations

import asyncio
import os
import time

from rmqdelay.worker import Worker
from rmqdelay.worker.context import Context

app = Worker()
_SLEEP = float(os.environ.get("WORKER_TEST_SLEEP", "0"))
BATCH = os.environ.get("WORKER_TEST_BATCH", "batch")
SLOW = os.environ.get("WORKER_TEST_SLOW", "slow")


def record(event: str, ctx: Context) -> None:
    path = os.environ["WORKER_TEST_LOG"]
    line = f"{event} {ctx.message_id} {ctx.attempt} {os.getpid()}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@app.handler(BATCH)
def batch(msg: dict[str, int], ctx: Context) -> None:
    """Sync: runs in the worker's thread pool."""
    record("start", ctx)
    time.sleep(_SLEEP)
    record("done", ctx)


@app.handler(SLOW)
async def slow(msg: str, ctx: Context) -> None:
    """Async: runs as a task on the worker's event loop."""
    record("start", ctx)
    await asyncio.sleep(_SLEEP)
    record("done", ctx)


RECUR = os.environ.get("WORKER_TEST_RECUR", "recur")


@app.handler(RECUR)
async def recur(msg: object, ctx: Context) -> None:
    """Async, for recurring occurrences (their ids name the occurrence's time)."""
    record("start", ctx)
    await asyncio.sleep(_SLEEP)
    record("done", ctx)


HELD = os.environ.get("WORKER_TEST_HELD", "held")


@app.handler(HELD)
async def held(msg: object, ctx: Context) -> None:
    """Async, for a held destination: one ``held <id> <due ms> <now ms> <pid>`` line."""
    due_ms = 0 if ctx.due_at is None else round(ctx.due_at.timestamp() * 1000)
    line = f"held {ctx.message_id} {due_ms} {time.time_ns() // 1_000_000} {os.getpid()}\n"
    fd = os.open(os.environ["WORKER_TEST_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
