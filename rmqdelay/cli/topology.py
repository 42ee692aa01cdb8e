"""``rmqdelay topology``: plan, apply, verify and destroy the broker objects."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.exceptions import Exit

from .options import (
    Group,
    broker_options,
    epilog,
    friendly_errors,
    management_url_option,
    settings_from,
    usage_error,
)
from .output import Cell, err, out, print_table

if TYPE_CHECKING:
    from ..amqp.topology_manager import TopologyManager
    from ..settings import Settings

__all__ = ["app"]

# The broker client, the settings and rich are imported when a command runs: see options.
app = Group(
    "topology",
    help="Declare, compare, verify or remove the delay tiers and work queues.",
    no_args_is_help=True,
)

_destinations = click.option(
    "-d",
    "--destination",
    multiple=True,
    metavar="DESTINATION",
    help="A destination (work queue); repeat for more.",
)
_held = click.option(
    "--held",
    multiple=True,
    metavar="DESTINATION",
    help="A destination whose consumers are all rmqdelay's, marked held: its messages come "
    "up to the hold window early and the consumer waits out the rest (besides "
    "held_destinations); repeat for more.",
)
_management_url = management_url_option("to list bindings and work queues")
_STATUS_STYLE = {
    "ok": "green",
    "missing": "yellow",
    "differs": "bold red",
    "unchecked": "dim",
    "stale": "bold red",
}


@app.command(
    "plan",
    epilog=epilog(
        "Exits 0 only when nothing is missing or different; a held marker of a destination "
        "not held (stale) is a difference.",
        "rmqdelay topology plan -d orders-timeout",
        "rmqdelay topology plan -d orders-timeout --held emails",
    ),
)
@_destinations
@_held
@broker_options
@click.option("--show-ok/--no-show-ok", default=False, help="List objects that are fine too.")
@_management_url
@friendly_errors
def topology_plan(
    destination: tuple[str, ...],
    held: tuple[str, ...],
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
    show_ok: bool,
    management_url: str | None,
) -> None:
    """Show what exists, what `apply` would create, and what differs."""
    from ..amqp.topology_manager import TopologyManager

    settings = settings_from(url, prefix, config, management_url=management_url)
    with TopologyManager(settings, held=held) as manager:
        states = manager.plan(destination)
        unusable = _management_note(manager, settings, "bindings were not checked")
    counts: dict[str, int] = {}
    rows: list[tuple[Cell, ...]] = []
    for state in states:
        counts[state.status] = counts.get(state.status, 0) + 1
        if show_ok or state.status != "ok":
            status = (state.status, _STATUS_STYLE[state.status])
            rows.append((state.kind, state.name, status, state.detail))
    if rows:
        print_table(
            ("kind", "name", "status", "detail"),
            rows,
            title=f"topology {settings.prefix} on {settings.masked_url}",
            console=out(),
        )
    out().print(", ".join(f"{n} {status}" for status, n in sorted(counts.items())))
    if counts.get("missing") or counts.get("differs") or counts.get("stale") or unusable:
        raise Exit(1)


@app.command(
    "apply",
    epilog=epilog(
        "Idempotent; never deletes: a held marker of a destination no longer held is "
        "reported, with how to remove it.",
        "rmqdelay topology apply -d orders-timeout -d emails",
        "rmqdelay topology apply -d orders-timeout --held emails",
    ),
)
@_destinations
@_held
@broker_options
@friendly_errors
def apply(
    destination: tuple[str, ...],
    held: tuple[str, ...],
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Declare every tier, exchange, binding, the parking queue and the work queues."""
    from ..amqp.topology_manager import DELIVERY_LIMIT_NOTE, PLACEMENT_NOTE, TopologyManager

    settings = settings_from(url, prefix, config)
    with TopologyManager(settings, held=held) as manager:
        topology = manager.apply(destination)
        stale = manager.stale_notes(destination)
    work = [q.name for q in topology.queues if q.role == "work"]
    out().print(
        f"applied {len(topology.exchanges)} exchanges, {len(topology.queues)} queues "
        f"and {len(topology.bindings)} bindings on {settings.masked_url}"
        + (f"; work queues: {', '.join(work)}" if work else "")
    )
    if manager.held:
        out().print(
            f"held (consumers wait out the last {settings.layout.hold_ms} ms): "
            + ", ".join(manager.held)
        )
    if manager.placement_kept:
        out().print(f"note: {len(manager.placement_kept)} existing queue(s) were {PLACEMENT_NOTE}")
    if manager.delivery_limit_kept:
        out().print(f"note: the parking queue was {DELIVERY_LIMIT_NOTE}")
    for name in manager.retention_kept:
        out().print(f"note: the stream {name} was {manager.retention_note()}")
    from rich.markup import escape

    for note in stale:
        err().print(f"[yellow]warning:[/] {escape(note)}", highlight=False)


@app.command(
    "verify",
    epilog=epilog(
        "Needs no configure permission. A held marker of a destination not held is a problem.",
        "rmqdelay topology verify -d orders-timeout",
        "rmqdelay topology verify -d orders-timeout --held emails",
    ),
)
@_destinations
@_held
@broker_options
@_management_url
@friendly_errors
def topology_verify(
    destination: tuple[str, ...],
    held: tuple[str, ...],
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
    management_url: str | None,
) -> None:
    """Check passively that every object exists; exit 1 with the list of problems."""
    from ..amqp.topology_manager import TopologyManager

    settings = settings_from(url, prefix, config, management_url=management_url)
    with TopologyManager(settings, held=held) as manager:
        problems = manager.verify(destination)
        unusable = _management_note(manager, settings, "bindings were not checked")
    for problem in problems:
        out().print(f"[red]problem:[/] {problem}", highlight=False)
    if problems or unusable:
        raise Exit(1)
    if manager.management_problem:
        out().print(f"topology {settings.prefix}: exchanges and queues exist; bindings unchecked")
    else:
        out().print(f"topology {settings.prefix} is complete")


@app.command(
    "destroy",
    epilog=epilog("Add --force to drop held messages too.", "rmqdelay topology destroy --yes"),
)
@click.option("--yes", is_flag=True, help="Confirm the removal.")
@click.option(
    "--force/--no-force", default=False, help="Remove queues even when they hold messages."
)
@_destinations
@broker_options
@_management_url
@friendly_errors
def topology_destroy(
    yes: bool,
    force: bool,
    destination: tuple[str, ...],
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
    management_url: str | None,
) -> None:
    """Remove the prefix's tiers, exchanges, parking and work queues."""
    if not yes:
        raise usage_error("destroy removes queues and their messages: pass --yes")
    from ..amqp.topology_manager import TopologyManager

    settings = settings_from(url, prefix, config, management_url=management_url)
    with TopologyManager(settings) as manager:
        _management_note(
            manager, settings, "only the work queues named with -d are removed", fatal=False
        )
        deleted = manager.destroy(destination, force=force)
    out().print(f"deleted {len(deleted)} objects of {settings.prefix}")


def _management_note(
    manager: TopologyManager, settings: Settings, consequence: str, *, fatal: bool = True
) -> bool:
    """Say why the management API cannot be used, if so, rather than report bindings
    missing.  Returns True (an error) when the user configured it and ``fatal``: a
    missing default API is only a note."""
    problem = manager.management_problem
    if problem is None:
        return False
    error = fatal and settings.management_url is not None
    label = "[bold red]error:[/]" if error else "[yellow]note:[/]"
    from rich.markup import escape

    err().print(f"{label} {consequence}: {escape(problem)}", highlight=False)
    return error
