"""``rmqdelay status``: what is scheduled, waiting, parked and journaled, at a glance."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .options import Command, broker_options, epilog, friendly_errors, out, settings_from

if TYPE_CHECKING:
    from rich.console import Group

    from ..core.status import Status

__all__ = ["status"]

# rmqdelay.amqp.status.MAX_PARKED_PEEK, for the option's range (a unit test keeps them
# equal): the broker client and rich are imported when the command runs, see options.
MAX_PARKED_PEEK = 65_535


def _n(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


def _render(status: Status) -> Group:
    from rich.console import Group
    from rich.table import Table

    from ..core.durations import format_ms

    tiers = Table("tier", "TTL", "messages", title=f"scheduled: {status.scheduled:,}")
    for tier in status.tiers:
        if tier.messages:
            tiers.add_row(tier.queue, format_ms(tier.ttl_ms), _n(tier.messages))
    work = Table("destination", "ready", "unacked", "consumers", title="work queues")
    for row in status.destinations:
        work.add_row(row.destination, _n(row.ready), _n(row.unacked), _n(row.consumers))
    lines = [f"parked: {_n(status.parked)}"]
    peek = status.parked_by_destination
    if peek is not None:
        parts = [f"{d} {n:,}" for d, n in peek.destinations.items()]
        parts += [f"no destination {peek.unknown:,}"] if peek.unknown else []
        of = "all" if peek.complete else f"the first {peek.read:,}"
        lines.append(f"parked by destination ({of} read): {', '.join(parts) or 'none'}")
    if status.journal is not None:
        oldest = status.journal.oldest_ms
        since = (
            datetime.fromtimestamp(oldest / 1000, tz=timezone.utc).isoformat(timespec="seconds")
            if oldest
            else "n/a"
        )
        lines.append(
            f"journal {status.journal.stream}: {_n(status.journal.records)} writes, "
            f"oldest record {since}"
        )
    lines.append(f"source: {status.source}")
    if status.missing:
        lines.append(
            f"[yellow]{len(status.missing)} queue(s) missing, e.g. {status.missing[0]}: "
            "run `rmqdelay topology apply`[/]"
        )
    return Group(tiers, work, "\n".join(lines))


@click.command(
    "status",
    cls=Command,
    epilog=epilog(
        "Counts come from one management API call (or, without it, one passive "
        "declare a queue): the time does not grow with what is waiting, and no configure "
        "permission is needed (--parked-by-destination alone reads messages).",
        "rmqdelay status",
        "rmqdelay status --json",
        "rmqdelay status --watch",
        "rmqdelay status --prometheus",
        "rmqdelay status --parked-by-destination",
    ),
)
@click.option(
    "-d",
    "--destination",
    multiple=True,
    metavar="DESTINATION",
    help="Also show this destination; repeat.",
)
@click.option("--json", "as_json", is_flag=True, help="The same data as JSON.")
@click.option("--prometheus", is_flag=True, help="Prometheus text format (gauges).")
@click.option("--watch", is_flag=True, help="Refresh every second; Ctrl-C.")
@click.option("--amqp-only", is_flag=True, help="Passive declares, not the management API.")
@click.option(
    "--parked-by-destination",
    is_flag=True,
    help="Also count parked messages per destination. This READS them (none is "
    "removed), so it costs one step per parked message, up to --parked-limit; "
    "on RabbitMQ 4.0 each read counts toward the parking queue's default "
    "delivery limit of 20 (see the README's RabbitMQ versions).",
)
@click.option(
    "--parked-limit",
    type=click.IntRange(1, MAX_PARKED_PEEK),
    default=10_000,
    metavar="N",
    help="Read at most this many parked messages for --parked-by-destination.",
)
@broker_options
@friendly_errors
def status(
    destination: tuple[str, ...],
    as_json: bool,
    prometheus: bool,
    watch: bool,
    amqp_only: bool,
    parked_by_destination: bool,
    parked_limit: int,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Show scheduled messages per tier, work queues, parking and the schedule journal."""
    settings = settings_from(url, prefix, config)
    from ..amqp.status import gather_status
    from ..core.status import prometheus_text

    def snapshot() -> Status:
        return gather_status(
            settings,
            list(destination) or None,
            use_management=not amqp_only,
            parked_peek=parked_limit if parked_by_destination else None,
        )

    if as_json:
        print(json.dumps(snapshot().to_json()))
    elif prometheus:
        print(prometheus_text(snapshot()), end="")
    elif watch:
        from rich.live import Live

        with Live(_render(snapshot()), console=out(), refresh_per_second=4) as live:
            try:
                while True:
                    time.sleep(1)
                    live.update(_render(snapshot()))
            except KeyboardInterrupt:
                pass
    else:
        out().print(_render(snapshot()))
