"""The seeds' failing case, on rmqdelay: 5, 4, 3, 2 and 1 s, published in that order.

On one queue with per-message expiration, all five arrive together after 5 s (the 1 s
message waits behind the 5 s one). Here each arrives at its own due time.

Run it with ``make demo``, or ``RMQDELAY_URL=amqp://... python examples/seeds_demo.py``.
"""

from __future__ import annotations

import asyncio
import os
import time

import aio_pika
from rich.console import Console
from rich.table import Table

from rmqdelay import AsyncPublisher, Settings
from rmqdelay.amqp.topology_manager import TopologyManager

DELAYS = (5, 4, 3, 2, 1)


async def main() -> None:
    console = Console()
    settings = Settings(
        url=os.environ.get("RMQDELAY_URL", "amqp://guest:guest@localhost:5672/%2F"),
        prefix="rmqdelay-demo",
        max_delay="1h",
    )
    with TopologyManager(settings) as manager:
        manager.apply(["seeds"])
    console.print(f"topology {settings.prefix} applied on {settings.masked_url}")

    arrivals: list[tuple[int, aio_pika.abc.AbstractIncomingMessage]] = []
    done = asyncio.Event()
    connection = await aio_pika.connect(settings.url.get_secret_value())
    channel = await connection.channel()
    queue = await channel.get_queue(manager.layout.work_queue("seeds"), ensure=True)
    await queue.purge()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        arrivals.append((time.time_ns() // 1_000_000, message))
        await message.ack()
        if len(arrivals) == len(DELAYS):
            done.set()

    await queue.consume(on_message)
    start_ms = time.time_ns() // 1_000_000
    async with AsyncPublisher(settings) as publisher:
        for seconds in DELAYS:
            result = await publisher.publish("seeds", f"{seconds} s", delay=seconds)
            console.print(f"published {seconds} s  id {result.message_id}  hops {result.hops}")
    await asyncio.wait_for(done.wait(), timeout=30)
    await connection.close()

    table = Table(title="arrivals (published 5, 4, 3, 2, 1 s in that order)")
    for column in ("#", "message", "due at +ms", "arrived at +ms", "lateness ms"):
        table.add_column(column, justify="right")
    table.add_column("timeline, a dot per 250 ms", no_wrap=True, min_width=22)
    for n, (at_ms, message) in enumerate(arrivals, 1):
        due = int(message.headers["rmqdelay-due-at"])  # type: ignore[arg-type]
        bar = "·" * ((at_ms - start_ms) // 250) + "●"
        table.add_row(
            str(n),
            message.body.decode(),
            str(due - start_ms),
            str(at_ms - start_ms),
            str(at_ms - due),
            bar,
        )
    console.print(table)
    order = [m.body.decode() for _, m in arrivals]
    early = [m.body.decode() for at, m in arrivals if at < int(m.headers["rmqdelay-due-at"])]  # type: ignore[arg-type]
    ok = order == ["1 s", "2 s", "3 s", "4 s", "5 s"] and not early
    with TopologyManager(settings) as manager:
        manager.destroy(["seeds"], force=True)
    console.print(
        "[green]each message arrived at its own due time, in order 1 to 5[/]"
        if ok
        else f"[red]unexpected: order {order}, early {early}[/]"
    )
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    asyncio.run(main())
