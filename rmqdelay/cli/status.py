"""``rmqdelay status``: what is scheduled, waiting, parked and journaled, at a glance."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.exceptions import Exit

from ..core.clock import iso_of_ms
from .options import (
    Command,
    broker_options,
    duration_us,
    epilog,
    friendly_errors,
    json_option,
    settings_from,
    usage_error,
)
from .output import Cell, err, out, print_json, print_table, rich_table, text

if TYPE_CHECKING:
    from rich.console import Group

    from ..core.status import JournalStatus, Status, StuckTier

__all__ = ["STUCK_EXIT_CODE", "status"]

STUCK_EXIT_CODE = 3
"""``status --check``: a tier has held messages past their time for --stuck-after."""
CHECK_INTERVAL_S = 1.0
"""How often ``--check`` takes a snapshot while some tier holds past-time messages."""

# rmqdelay.amqp.status.MAX_PARKED_PEEK, for the option's range (a unit test keeps them
# equal): the broker client and rich are imported when the command runs, see options.
MAX_PARKED_PEEK = 65_535


def _n(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


def _checkpoint_line(journal: JournalStatus) -> str:
    """Where readers start: the latest checkpoint's age, what it holds."""
    at = journal.checkpoint_at_ms
    if at is None:
        return "latest checkpoint: none yet (readers read the journal itself)"
    from ..core.durations import format_ms

    age = format_ms(max(0, int(time.time() * 1000) - at) // 1000 * 1000)
    size = journal.checkpoint_bytes or 0
    return (
        f"latest checkpoint: {iso_of_ms(at, 'seconds')} ({age} ago), "
        f"{_n(journal.checkpoint_copies)} copies pending, {size / 1e6:,.1f} MB"
    )


def _held(seconds: float | None) -> str:
    """How long a tier has held past-time messages, as the table shows it."""
    if seconds is None:
        return "?"  # one snapshot: no age
    return f">= {int(seconds)} s"


_Table = tuple[str, tuple[str, ...], list[tuple["Cell", ...]]]


def _tables(status: Status) -> tuple[list[_Table], list[Cell]]:
    """The status as tables (title, columns, rows) and lines."""
    from ..core.durations import format_ms

    past = status.past_due
    title = f"scheduled: {status.scheduled:,}, past their time: "
    title += "unknown (needs the management API)" if past is None else f"{past:,}"
    tiers: list[tuple[Cell, ...]] = []
    for tier in status.tiers:
        if tier.messages or tier.past_due:
            past_due = "unknown" if tier.past_due is None else f"{tier.past_due:,}"
            held = _held(tier.past_due_for_s) if tier.past_due else ""
            shown: Cell = (past_due, "bold red") if tier.past_due else past_due
            tiers.append((tier.queue, format_ms(tier.ttl_ms), _n(tier.messages), shown, held))
    work: list[tuple[Cell, ...]] = [
        (row.destination, _n(row.ready), _n(row.unacked), _n(row.consumers))
        for row in status.destinations
    ]
    lines: list[Cell] = [f"parked: {_n(status.parked)}"]
    marked = [row.destination for row in status.destinations if row.held]
    if marked:
        lines.append(
            f"held (consumers wait out up to {format_ms(status.hold_ms)}; a plain AMQP "
            f"consumer would get messages early): {', '.join(marked)}"
        )
    peek = status.parked_by_destination
    if peek is not None:
        parts = [f"{d} {n:,}" for d, n in peek.destinations.items()]
        parts += [f"no destination {peek.unknown:,}"] if peek.unknown else []
        of = "all" if peek.complete else f"the first {peek.read:,}"
        lines.append(f"parked by destination ({of} read): {', '.join(parts) or 'none'}")
    if status.journal is not None:
        oldest = status.journal.oldest_ms
        since = iso_of_ms(oldest, "seconds") if oldest else "n/a"
        lines.append(
            f"journal {status.journal.stream}: {_n(status.journal.records)} writes, "
            f"oldest record {since}"
        )
        lines.append(_checkpoint_line(status.journal))
    if any(t.past_due and t.past_due_for_s is None for t in status.tiers):
        lines.append(
            "past time: expired, held until the next queue takes them; how long cannot be "
            "told from one snapshot: `status --watch` or `--check` watch them"
        )
    if status.recurring is not None:
        counts = status.recurring
        lines.append(
            f"recurring schedules: {counts.get('active', 0):,} active, "
            f"{counts.get('paused', 0):,} paused"
        )
    lines.append(f"source: {status.source}")
    if status.missing:
        missing = f"{len(status.missing)} queue(s) missing, e.g. {status.missing[0]}: "
        lines.append((missing + "run `rmqdelay topology apply`", "yellow"))
    return [
        (title, ("tier", "TTL", "messages", "past time", "held"), tiers),
        ("work queues", ("destination", "ready", "unacked", "consumers"), work),
    ], lines


_RIGHT = ("messages", "past time", "ready", "unacked", "consumers")


def _render(status: Status) -> Group:
    """The status as rich draws it on a terminal (``--watch``)."""
    from rich.console import Group
    from rich.text import Text

    tables, lines = _tables(status)
    drawn = [
        rich_table(columns, rows, title=title, right=_RIGHT) for title, columns, rows in tables
    ]
    return Group(*drawn, Text("\n").join(map(text, lines)))


def _print(status: Status) -> None:
    """The status as tables and lines: rich's on a terminal, plain into a pipe."""
    tables, lines = _tables(status)
    for title, columns, rows in tables:
        print_table(columns, rows, title=title, right=_RIGHT, console=out())
    for line in lines:
        out().print(text(line), highlight=False)


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
        "rmqdelay status --recurring",
        "rmqdelay status --check --stuck-after 2m",
    ),
)
@click.option(
    "-d",
    "--destination",
    multiple=True,
    metavar="DESTINATION",
    help="Also show this destination; repeat.",
)
@json_option(lines=False)
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
@click.option(
    "--recurring",
    is_flag=True,
    help="Also count recurring schedules (active, paused). This reads the schedule "
    "journal's latest checkpoint and the journal after it.",
)
@click.option(
    "--check",
    is_flag=True,
    help="Exit 3 when a tier has held messages past their time (expired, waiting for "
    "the next queue to take them) for --stuck-after: it watches such tiers, a snapshot "
    "a second, until they drain or that time has passed; 0 otherwise. Needs the "
    "management API (AMQP cannot count them): exits 1 without it.",
)
@click.option(
    "--stuck-after",
    default="60s",
    show_default=True,
    metavar="DURATION",
    help="How long --check lets a tier hold past-time messages, e.g. 30s, 5m.",
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
    recurring: bool,
    check: bool,
    stuck_after: str,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Show scheduled and past-time messages per tier, work queues, parking and the
    schedule journal."""
    if check and watch:
        raise usage_error("--check and --watch exclude each other: --check exits when done")
    if check and amqp_only:
        raise usage_error("--check needs the management API: AMQP cannot count past-time messages")
    stuck_after_s = _stuck_after(stuck_after)
    settings = settings_from(url, prefix, config)
    from ..amqp.status import gather_status
    from ..core.status import PastDueWatch, prometheus_text

    def snapshot() -> Status:
        found = gather_status(
            settings,
            list(destination) or None,
            use_management=not amqp_only,
            parked_peek=parked_limit if parked_by_destination else None,
        )
        if not recurring:
            return found
        from ..amqp.publisher import Publisher

        with Publisher(settings) as publisher:
            schedules = publisher.list_recurring()
        counts = {"active": 0, "paused": 0}
        for schedule in schedules:
            counts[schedule.state] = counts.get(schedule.state, 0) + 1
        return dataclasses.replace(found, recurring=counts)

    stuck: list[StuckTier] = []
    if check:
        from ..core.status import watch_past_due

        current, stuck = watch_past_due(
            snapshot,
            stuck_after_s,
            interval_s=CHECK_INTERVAL_S,
            clock=time.monotonic,
            sleep=time.sleep,
        )
        if all(t.past_due is None for t in current.tiers):
            from ..amqp.management import MANAGEMENT_URL_HINT
            from ..errors import ConfigurationError

            raise ConfigurationError(
                f"--check cannot tell: the status came from {current.source}, which counts "
                "no past-time messages; it needs the management API "
                f"({MANAGEMENT_URL_HINT})"
            )
    else:
        current = snapshot()
    if as_json:
        data = current.to_json()
        if check:
            data["stuck_after_s"] = stuck_after_s
            data["stuck"] = [dataclasses.asdict(s) for s in stuck]
        print_json(data)
    elif prometheus:
        print(prometheus_text(current), end="")
    elif watch:
        from rich.live import Live

        past_due = PastDueWatch()
        first = past_due.observe(current, time.monotonic())
        with Live(_render(first), console=out(), refresh_per_second=4) as live:
            try:
                while True:
                    time.sleep(1)
                    live.update(_render(past_due.observe(snapshot(), time.monotonic())))
            except KeyboardInterrupt:
                pass
    else:
        _print(current)
    if check:
        _verdict(current, stuck, stuck_after_s)


def _stuck_after(text: str) -> float:
    return duration_us(text, "--stuck-after") / 1e6


def _verdict(status: Status, stuck: list[StuckTier], after_s: float) -> None:
    """One line per stuck tier on stderr and exit 3; else a line saying all is well."""
    from rich.markup import escape

    unknown = sum(1 for t in status.tiers if t.past_due is None)
    note = f" ({unknown} tier(s) not counted: no statistics yet)" if unknown else ""
    if not stuck:
        err().print(
            f"ok: no tier has held messages past their time for {after_s:g} s{note}",
            highlight=False,
        )
        return
    for tier in stuck:
        err().print(f"[bold red]stuck:[/] {escape(tier.describe())}", highlight=False)
    raise Exit(STUCK_EXIT_CODE)
