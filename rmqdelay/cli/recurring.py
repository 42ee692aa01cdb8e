"""``rmqdelay recurring``: add, list, pause, resume and remove recurring schedules."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.exceptions import Exit

from ..core.clock import datetime_of_ms, iso_of_ms, now_ms
from .options import (
    Group,
    alias,
    argument,
    at_option,
    broker_options,
    delay_option,
    duration_us,
    epilog,
    friendly_errors,
    header_pairs,
    json_option,
    settings_from,
    time_value,
    usage_error,
)
from .output import print_json, print_table
from .publish import CONTENT_TYPE, DESTINATION_HELP, read_body

if TYPE_CHECKING:
    from ..core.journal.recurring import RecurringResult

__all__ = ["app"]

app = Group(
    "recurring",
    help="Recurring schedules: a message on a cron rule or every so often, each occurrence "
    "handled once (needs the schedule journal).",
    no_args_is_help=True,
)


def _print(result: RecurringResult, as_json: bool) -> None:
    if as_json:
        print_json(result.to_json())
    else:
        print(result.describe(), flush=True)


@app.command(
    "add",
    epilog=epilog(
        "Each occurrence is an ordinary delayed message to DESTINATION with the key "
        "recurring:NAME@<occurrence ms>; the worker that gets one publishes the next "
        "(confirmed) before calling the handler, then acks, so a crash neither doubles "
        "nor loses a firing. --cron follows DST as cron does (a time in the spring gap "
        "fires right after it, a fixed time in the autumn repeat fires once); --every "
        "is absolute time, counted from the Unix epoch (every 15m: :00, :15, :30, :45 "
        "UTC) or from --at (or --delay). Adding a schedule that exists with the same rule "
        "and destination says 'exists'.",
        'rmqdelay recurring add daily-report reports \'{"kind": "daily"}\' '
        "--cron '0 9 * * *' --tz Europe/Berlin --json",
        "rmqdelay recurring add poll poller ping --every 15m",
    ),
)
@argument("name", help="The schedule's name: letters, digits, . _ : / -")
@argument("destination", help=DESTINATION_HELP, required=False, needed=True)
@argument("body", help="The body of every occurrence; '-' reads standard input.", default="")
@click.option("--cron", metavar="EXPR", help="5 fields: minute hour day month weekday.")
@click.option("--tz", metavar="ZONE", help="With --cron: an IANA zone.  [default: UTC]")
@click.option("--every", metavar="DURATION", help="e.g. 30s, 15m, 1h (at least 1s).")
@delay_option("No occurrence before this time from now")
@at_option("No occurrence before this time")
@alias(
    "-d",
    "--destination",
    "old_destination",
    target="destination",
    new="the DESTINATION argument",
    shifts="body",
)
@alias("--first-at", "old_first_at", target="at", new="--at")
@click.option("-H", "--header", multiple=True, metavar="KEY=VALUE", help="k=v; repeat.")
@CONTENT_TYPE
@json_option(lines=False)
@broker_options
@friendly_errors
def add(
    name: str,
    destination: str,
    body: str,
    cron: str | None,
    tz: str | None,
    every: str | None,
    delay: str | None,
    at: str | None,
    header: tuple[str, ...],
    content_type: str | None,
    as_json: bool,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Add a recurring schedule and publish its first occurrence."""
    if (cron is None) == (every is None):
        raise usage_error("give exactly one of --cron or --every")
    if tz is not None and cron is None:
        raise usage_error("--tz goes with --cron (--every is absolute time)")
    if delay is not None and at is not None:
        raise usage_error("give at most one of --delay or --at")
    from ..core.journal.rules import parse_rule
    from ..errors import RecurringError

    try:  # the command line is read whole before anything connects: its mistakes exit 2
        parse_rule(cron=cron, tz=tz, every=every)
    except RecurringError as exc:
        raise usage_error(str(exc)) from None
    start = time_value(at)
    if delay is not None:
        start = datetime_of_ms(now_ms() + duration_us(delay, "--delay") // 1000)
    headers = header_pairs(header)
    payload, content_type = read_body(body, content_type)
    settings = settings_from(url, prefix, config)
    from ..amqp.publisher import Publisher

    with Publisher(settings) as publisher:
        result = publisher.add_recurring(
            name,
            destination,
            payload,
            cron=cron,
            tz=tz,
            every=every,
            first_at=start,
            headers=headers,
            content_type=content_type,
        )
    _print(result, as_json)


def _switch(op: str, name: str, as_json: bool, url: Any, prefix: Any, config: Any) -> None:
    settings = settings_from(url, prefix, config)
    from ..amqp.publisher import Publisher

    with Publisher(settings) as publisher:
        call = {
            "pause": publisher.pause_recurring,
            "resume": publisher.resume_recurring,
            "remove": publisher.remove_recurring,
        }[op]
        result = call(name)
    _print(result, as_json)
    if result.outcome == "unknown":
        raise Exit(1)


_JSON = json_option(lines=False)


@app.command("pause", epilog=epilog("Occurrences go on, unhandled, until resumed."))
@argument("name", help="The schedule's name.")
@_JSON
@broker_options
@friendly_errors
def pause(
    name: str, as_json: bool, url: tuple[str, ...], prefix: str | None, config: Path | None
) -> None:
    """Pause a schedule: no handler runs until it is resumed. Exits 1 if unknown."""
    _switch("pause", name, as_json, url, prefix, config)


@app.command("resume", epilog=epilog("The occurrences missed while paused are not run late."))
@argument("name", help="The schedule's name.")
@_JSON
@broker_options
@friendly_errors
def resume(
    name: str, as_json: bool, url: tuple[str, ...], prefix: str | None, config: Path | None
) -> None:
    """Resume a paused schedule from its next occurrence. Exits 1 if unknown."""
    _switch("resume", name, as_json, url, prefix, config)


@app.command(
    "remove",
    epilog=epilog(
        "The chain ends; its pending occurrence is cancelled. Removing it again answers "
        "'removed' as the first time did, as a second cancel of an id answers 'cancelled'."
    ),
)
@argument("name", help="The schedule's name.")
@_JSON
@broker_options
@friendly_errors
def remove(
    name: str, as_json: bool, url: tuple[str, ...], prefix: str | None, config: Path | None
) -> None:
    """Remove a schedule and cancel its pending occurrence. Exits 1 if unknown."""
    _switch("remove", name, as_json, url, prefix, config)


@app.command("list", epilog=epilog("", "rmqdelay recurring list --json"))
@json_option(lines=True)
@broker_options
@friendly_errors
def list_(as_json: bool, url: tuple[str, ...], prefix: str | None, config: Path | None) -> None:
    """List the schedules (not removed) with their state and next and last occurrences."""
    settings = settings_from(url, prefix, config)
    from ..amqp.publisher import Publisher

    with Publisher(settings) as publisher:
        schedules = publisher.list_recurring()
    now = now_ms()
    if as_json:
        for schedule in schedules:
            print_json(schedule.to_json(now))
        return

    def when(ms: int | None) -> str:
        return "-" if ms is None else iso_of_ms(ms)

    active = sum(s.state == "active" for s in schedules)
    print_table(
        ("name", "rule", "destination", "state", "next (UTC)", "last (UTC)"),
        (
            (
                s.name,
                s.rule.describe(),
                s.destination,
                s.state,
                when(s.next_occurrence(now)),
                when(s.last_occurrence(now)),
            )
            for s in schedules
        ),
        caption=f"{len(schedules)} schedule(s): {active} active, {len(schedules) - active} paused",
    )
