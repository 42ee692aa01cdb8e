"""``rmqdelay move --to URL``: what waits on this cluster, moved to another (blue-green)."""

from __future__ import annotations

from pathlib import Path

import click
from click.exceptions import Exit

from .options import Command, broker_options, epilog, friendly_errors, json_option
from .output import err, out, print_json

__all__ = ["move_command"]


@click.command(
    "move",
    cls=Command,
    epilog=epilog(
        "For a blue-green upgrade: every message waiting in this cluster's tiers and work "
        "queues (--url) is taken, published to the new cluster (--to) at its own due time "
        "with its id, headers, body, attempt and key, confirmed there, and only then acked "
        "here. Recurring schedules go with their waiting occurrence; cancelled messages, "
        "keys' losers and rescheduled copies stay behind. The new cluster's topology is "
        "declared for each destination met. Cut off, it loses nothing: run it again, and "
        "what the new cluster's journal holds already is only acked here. Parked messages "
        "stay. Exits 1 when something was not moved.",
        "rmqdelay move --url amqp://old-cluster --to amqps://new-cluster --dry-run",
        "rmqdelay move --to amqps://user@new-cluster/prod --json",
    ),
)
@click.option("--to", "to", required=True, metavar="URL", help="The new cluster's AMQP URL.")
@click.option("--to-prefix", metavar="PREFIX", help="The new cluster's prefix (default: the same).")
@click.option("--dry-run", is_flag=True, help="Count what waits here; move nothing.")
@json_option(lines=False)
@broker_options
@friendly_errors
def move_command(
    to: str,
    to_prefix: str | None,
    dry_run: bool,
    as_json: bool,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Move every waiting message of the prefix to another cluster."""
    from rich.markup import escape

    from ..amqp.mover import Mover
    from .options import settings_from

    old = settings_from(url, prefix, config)
    new = settings_from((to,), to_prefix or old.prefix, config)
    if old.urls == new.urls and old.prefix == new.prefix:
        raise click.UsageError("--to names this very cluster and prefix: nothing to move")
    mover = Mover(old, new)
    if dry_run:
        mover.report.dry_run = True
        mover.report.waiting = mover.waiting()
        report = mover.report
    elif as_json:
        report = mover.run()
    else:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=err(), transient=True) as bar:
            task = bar.add_task("move", total=mover.waiting())  # what waits as it starts
            report = mover.run(progress=lambda done: bar.update(task, completed=done))
    if as_json:
        print_json(report.to_json())
    else:
        out(emoji=False).print(escape(report.describe()), highlight=False)
    if report.left:
        raise Exit(1)
