"""The rmqdelay Worker as the bench's drain, run as its own process (like ``rmqdelay worker``).

    python -m bench.peers.rmqdelay_worker '<settings as JSON>' --destination bench \
        --concurrency 64 [--prefetch 256] --log-level WARNING

It builds a real :class:`rmqdelay.Worker` with one async handler for ``--destination`` and
runs it with ``RunningWorker.run_until_signalled()`` (the same loop the CLI runs: SIGTERM
stops it gracefully). The handler takes the arrival time first thing, then queues one line
per message for the parent, flushed to stdout every few milliseconds::

    READY                                   once the worker consumes
    <message_id> <pub_ms> <due_ms> <received_ms> <x-death hops> <attempt>
    DONE <exit code>                        after a graceful stop

``x-death hops`` is the sum of the broker's ``x-death`` counts: the tier queues the message
actually went through, a cross-check of ``PublishResult.hops``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

from rmqdelay import Context, Settings, Worker

HDR_PUB = "x-bench-pub"
HDR_DUE = "x-bench-due"
FLUSH_S = 0.005


def death_hops(headers: Any) -> int:
    deaths = headers.get("x-death") if hasattr(headers, "get") else None
    if not isinstance(deaths, list):
        return 0
    total = 0
    for death in deaths:
        count = death.get("count", 1) if isinstance(death, dict) else 1
        total += int(count) if isinstance(count, (int, float)) else 1
    return total


async def main_async(args: argparse.Namespace) -> int:
    settings = Settings(**json.loads(args.settings))
    app = Worker(settings)
    lines: list[str] = []
    out = sys.stdout

    @app.handler(args.destination, max_attempts=1)
    async def on_message(body: bytes, ctx: Context) -> None:
        received = time.time_ns() // 1_000_000
        headers = ctx.headers
        lines.append(
            f"{ctx.message_id} {int(headers.get(HDR_PUB, -1))} {int(headers.get(HDR_DUE, -1))} "
            f"{received} {death_hops(headers)} {ctx.attempt}\n"
        )

    def flush() -> None:
        if lines:
            chunk = "".join(lines)
            lines.clear()
            out.write(chunk)
        out.flush()

    async def flusher() -> None:
        while True:
            await asyncio.sleep(FLUSH_S)
            flush()

    runner = app.runner(settings, concurrency=args.concurrency, prefetch=args.prefetch)
    run = asyncio.create_task(runner.run_until_signalled())
    ready = asyncio.create_task(runner.ready.wait())
    await asyncio.wait({run, ready}, return_when=asyncio.FIRST_COMPLETED)
    if run.done():
        ready.cancel()
        return run.result()  # raises the start-up error
    out.write("READY\n")
    out.flush()
    pump = asyncio.create_task(flusher())
    try:
        code = await run
    finally:
        pump.cancel()
        flush()
    out.write(f"DONE {code}\n")
    out.flush()
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers.rmqdelay_worker")
    p.add_argument("settings", help="rmqdelay.Settings keyword arguments as a JSON object")
    p.add_argument("--destination", default="bench")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--prefetch", type=int, help="default: the Worker's own")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s %(message)s")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
