"""``rmqdelay parked``: list, replay and purge parked messages."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.exceptions import Exit

from ..core.clock import timedelta_of_us
from .options import (
    Group,
    broker_options,
    delay_option,
    duration_us,
    epilog,
    friendly_errors,
    json_option,
    settings_from,
    usage_error,
)
from .output import err, out, print_json, print_table

if TYPE_CHECKING:
    from ..amqp.parked_queue import ReplayReport

__all__ = ["app"]

# aio-pika (ParkedQueue), the settings and rich are imported when a command runs: see
# options. Output is printed with emoji off: ids are the user's (no ':smile:' emoji).
_PROGRESS_FROM = 20  # show a progress bar for batches at least this large
PARKED_HELP = "Inspect, replay and purge parked messages."
PARKED_EPILOG = epilog(
    "Parked messages are those a handler gave up on or parked, whose body did not decode, "
    "or that the broker parked (a quorum work queue's delivery limit; no work queue bound).",
    "rmqdelay parked list -d orders-timeout",
    "rmqdelay parked replay --limit 100",
    "rmqdelay parked purge --yes -d orders-timeout",
)


app = Group("parked", help=PARKED_HELP, epilog=PARKED_EPILOG, no_args_is_help=True)
_destination = click.option(
    "-d", "--destination", metavar="DESTINATION", help="Only this destination's."
)


def _timestamp(parked_at: Any) -> str:
    return parked_at.astimezone().strftime("%Y-%m-%d %H:%M:%S") if parked_at else "-"


@app.command("list")
@_destination
@json_option(lines=True)
@click.option(
    "--limit", type=click.IntRange(min=1), default=100, metavar="N", help="Show at most this many."
)
@broker_options
@friendly_errors
def parked_list(
    destination: str | None,
    as_json: bool,
    limit: int,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """List parked messages without removing them."""
    from ..amqp.parked_queue import ParkedQueue

    settings = settings_from(url, prefix, config)

    async def read() -> tuple[int, list[Any]]:
        async with ParkedQueue(settings) as parked:
            return await parked.list(destination, limit)

    import asyncio

    total, items = asyncio.run(read())
    if as_json:
        for item in items:
            print_json(item.to_json())
        return
    shown = f"{len(items)} shown" + (f" for {destination!r}" if destination else "")
    print_table(
        ("message id", "destination", "reason", "attempts", "parked at"),
        (
            (
                item.message_id or "-",
                item.destination or "?",
                item.reason,
                str(item.attempts),
                _timestamp(item.parked_at),
            )
            for item in items
        ),
        title=f"Parked messages in {ParkedQueue(settings).layout.parking}",
        caption=f"{shown}; {total} parked in all",
        right=("attempts",),
    )


@app.command("replay")
@_destination
@delay_option("Deliver after this time from now (default: now)")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="Replay at most this many.")
@broker_options
@friendly_errors
def parked_replay(
    destination: str | None,
    delay: str | None,
    limit: int | None,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Send parked messages back to their destinations, attempt count reset to 1."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from ..amqp.parked_queue import ParkedQueue

    wait = timedelta_of_us(duration_us(delay, "--delay") if delay is not None else 0)
    settings = settings_from(url, prefix, config)

    async def replay() -> ReplayReport:
        async with ParkedQueue(settings) as parked:
            total = await parked.count()
            if total < _PROGRESS_FROM:
                return await parked.replay(destination, delay=wait, limit=limit)
            columns = (
                TextColumn("replaying"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
            )
            with Progress(*columns, console=err(), transient=True) as bar:
                task = bar.add_task("replay", total=total)
                return await parked.replay(
                    destination,
                    delay=wait,
                    limit=limit,
                    progress=lambda seen: bar.update(task, completed=seen),
                )

    import asyncio

    report = asyncio.run(replay())
    out(emoji=False).print(f"replayed {report.replayed} message(s)")
    if report.skipped:
        print_table(
            ("message id", "why"),
            ((message_id or "-", why) for message_id, why in report.skipped),
            title=f"{len(report.skipped)} message(s) stayed parked",
            console=err(),
        )
        raise Exit(1)


@app.command("purge")
@click.option("--yes", is_flag=True, help="Confirm: purged messages are gone for good.")
@_destination
@broker_options
@friendly_errors
def parked_purge(
    yes: bool,
    destination: str | None,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Delete parked messages for good."""
    if not yes:
        raise usage_error("refusing to purge without --yes: purged messages are lost")
    from ..amqp.parked_queue import ParkedQueue

    settings = settings_from(url, prefix, config)

    async def purge() -> int:
        async with ParkedQueue(settings) as parked:
            return await parked.purge(destination)

    import asyncio

    count = asyncio.run(purge())
    which = f" of {destination!r}" if destination else ""
    out(emoji=False).print(f"purged {count} parked message(s){which}")
