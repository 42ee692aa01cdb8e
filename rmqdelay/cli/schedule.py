"""``rmqdelay scheduled list`` and ``rmqdelay cancel``: the schedule journal, read and used."""

from __future__ import annotations

import gc
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.exceptions import Exit

from .options import (
    Command,
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
from .output import err, out, print_json

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from ..core.journal.purge import PurgeResult
    from ..settings import Settings

__all__ = ["cancel_command", "reschedule_command", "scheduled_app"]

# The broker clients, the settings and rich are imported when a command runs: see options.
# Output is printed with emoji off: ids are the user's (no ':smile:' emoji), markup escaped.
scheduled_app = Group(
    "scheduled",
    help="See what is scheduled (what was published while the schedule journal was on).",
    no_args_is_help=True,
)
_PROGRESS_AFTER_S = 1.0
_record, _message_id = itemgetter(0), attrgetter("message_id")


@contextmanager
def _collector_paused() -> Iterator[None]:
    """A read makes several objects per record and none in a cycle: the collector's
    passes over them took 40 % of reading 100,000. On again after the command, for a
    caller that runs it in its own process (tests do)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@scheduled_app.command(
    "list",
    epilog=epilog(
        "Shows what was published while the schedule journal was on "
        "(schedule_journal = true), read from the `{prefix}.schedule` stream, minus what "
        "was cancelled or is already due. An id published more than once (a publish sent "
        "again after its confirm failed, a retry) shows one row per copy still ahead, "
        "with a copy column (2/3: its second copy of three). Keyed messages show their key "
        "and generation (the key's winners, counted in the journal read), occurrences of a "
        "recurring schedule its name; a publish ignored or replaced under its key is not "
        "listed, a rescheduled message shows at its new time. Up to 200 rows on a terminal "
        "print as a table; more, or into a pipe or a file, print as plain aligned columns, "
        "streamed. It reads the latest checkpoint and the journal after it; with --limit, "
        "only the checkpoint's soonest copies the page needs (a copy column then counts "
        "the copies read, which may miss an id's copies due long after the page's last).",
        "rmqdelay scheduled list --destination orders-timeout --limit 20",
        "rmqdelay scheduled list --key order-42 --json",
        "rmqdelay scheduled list --due-before 10m --json",
    ),
)
@click.option("-d", "--destination", metavar="DESTINATION", help="Only this destination.")
@click.option(
    "--due-before", metavar="TIME", help="Only messages due before: ISO 8601, or 10m from now."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    metavar="N",
    help="At most this many, soonest first (only as much of the schedule is read).",
)
@click.option("--key", metavar="KEY", help="Only the messages with this key.")
@json_option(lines=True)
@broker_options
@friendly_errors
@_collector_paused()
def scheduled_list(
    destination: str | None,
    due_before: str | None,
    limit: int | None,
    key: str | None,
    as_json: bool,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """List the messages still ahead and not cancelled, soonest first, every copy."""
    from ..amqp.journal import read_once
    from ..core.clock import ms_of_datetime
    from ..core.journal.flows import scheduled_rows
    from ..core.journal.reading import require_journal
    from .schedule_rows import json_lines, numbered, print_table, write_lines

    before = time_value(due_before, "--due-before", or_duration=True)
    settings = settings_from(url, prefix, config)
    require_journal(settings.layout, "`scheduled list`")
    progress = _ReadProgress(shown=not as_json)
    try:
        rows = read_once(
            settings,
            scheduled_rows(
                settings.layout,
                destination=destination,
                due_before_ms=None if before is None else ms_of_datetime(before),
                limit=limit,
                timeout=settings.confirm_timeout,
                progress=progress,
                key=key,
            ),
        )
    finally:
        progress.close()
    # copies are counted over what was read (with --limit: the checkpoint's copies up to
    # past the page, and the tail), then --limit cuts
    copies = Counter(map(_message_id, map(_record, rows)))
    if limit is not None:
        del rows[limit:]
    if as_json:
        write_lines(json_lines(rows, copies), sys.stdout.write)
        return
    shown = list(numbered(rows, copies))
    del rows
    print_table(shown, out(emoji=False))


@scheduled_app.command(
    "checkpoint",
    epilog=epilog(
        "Readers (workers, scheduled list, cancel, keyed publishes, the dashboard) start "
        "from the latest checkpoint and read only the journal written after it. Workers "
        "write one when the journal's tail outgrows the last, publishers when nobody else "
        "has for 15 minutes; this writes one now: before every worker is stopped for a "
        "while, or to see what one costs. Another process's checkpoint under way is left "
        "to finish (exit 1).",
        "rmqdelay scheduled checkpoint",
        "rmqdelay scheduled checkpoint --json",
    ),
)
@json_option(lines=False)
@broker_options
@friendly_errors
def scheduled_checkpoint(
    as_json: bool, url: tuple[str, ...], prefix: str | None, config: Path | None
) -> None:
    """Write a checkpoint of the schedule now, for readers to start from."""
    from ..amqp.checkpoints import write_checkpoint
    from ..core.journal.reading import require_journal
    from ..worker.checkpoints import writer_name

    settings = settings_from(url, prefix, config)
    require_journal(settings.layout, "`scheduled checkpoint`")
    started = time.perf_counter()
    written = write_checkpoint(settings, writer=writer_name())
    took = time.perf_counter() - started
    if written.outcome == "no checkpoint stream":
        raise click.ClickException(
            f"{settings.layout.prefix}.schedule has no checkpoint stream yet (a journal "
            "declared before checkpoints): run `rmqdelay topology apply` to add it"
        )
    if written.outcome != "written" or written.pointer is None:
        raise click.ClickException(
            "another process is writing a checkpoint: it will be the latest once done "
            "(a writer cut off half-way is taken over 2 minutes after its last part)"
        )
    pointer = written.pointer
    if as_json:
        said = {"seconds": round(took, 3), "tail_records": written.tail_records}
        print_json({**pointer.to_json(), **said, "gap": written.gap})
    else:
        out(emoji=False).print(
            f"checkpoint {pointer.id} written in {took:.1f} s: "
            f"{pointer.entries('copies'):,} copies pending, "
            f"{pointer.bytes:,} bytes, covering the journal up to offset {pointer.covers} "
            f"({written.tail_records:,} records read since the one before)",
            highlight=False,
        )
    if written.gap_text is not None:
        err().print(f"warning: {written.gap_text}", highlight=False)


class _ReadProgress:
    """The line "reading the schedule journal: N records" on stderr, once a read took
    over :data:`_PROGRESS_AFTER_S`; rich's progress is imported then, not at every start
    (most reads end sooner, and ``--json`` shows none)."""

    def __init__(self, *, shown: bool) -> None:
        self.shown = shown
        self.started = time.monotonic()
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def __call__(self, count: int) -> None:
        if not self.shown:
            return
        if self._progress is None:
            if time.monotonic() - self.started <= _PROGRESS_AFTER_S:
                return
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("reading the schedule journal: {task.completed:,} records"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task("read", total=None)
        assert self._task is not None
        self._progress.update(self._task, completed=count)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


@click.command(
    "cancel",
    cls=Command,
    epilog=epilog(
        "A worker acks a cancelled message without calling its handler when it falls "
        "due; a plain AMQP consumer does not know about cancels. Every copy of an id "
        "is cancelled (one id can wait as several copies: a publish sent again after its "
        "confirm failed, a retry); 'too late' means every copy is due already. Exits 0 "
        "only when every id was cancelled. --key cancels a key's current message (the key "
        "is then free for the next publish). Filters instead of ids (a selective purge): "
        "every message with a copy still ahead matching all of them is cancelled whole; "
        "--dry-run counts first, and more than one asks for confirmation (--yes, or "
        "refused when nobody can answer). Occurrences of recurring schedules are left "
        "alone (`rmqdelay recurring remove`).",
        "rmqdelay cancel 3f2b... 9c1d... --json",
        "rmqdelay cancel --key order-42",
        "rmqdelay cancel --destination orders --header tenant=acme --dry-run",
        "rmqdelay cancel --key-prefix cart- --due-after 2h --yes --json",
    ),
)
@argument("message_ids", nargs=-1, required=False, help="Message ids to cancel.")
@click.option("--key", multiple=True, metavar="KEY", help="A key to cancel; repeat.")
@click.option("-d", "--destination", metavar="DESTINATION", help="Filter: this destination.")
@click.option("--due-before", metavar="TIME", help="Filter: due before: ISO 8601, or 10m from now.")
@click.option("--due-after", metavar="TIME", help="Filter: due after: ISO 8601, or 10m from now.")
@click.option(
    "-H",
    "--header",
    "header",
    multiple=True,
    metavar="KEY=VALUE",
    help="Filter: k=v (the value compared as text); repeat.",
)
@click.option("--key-prefix", metavar="PREFIX", help="Filter: keyed messages whose key starts so.")
@click.option("--dry-run", is_flag=True, help="Count what the filters select; cancel nothing.")
@click.option("--yes", is_flag=True, help="Cancel what the filters select without asking.")
@json_option(lines=True)
@broker_options
@friendly_errors
def cancel_command(
    message_ids: tuple[str, ...],
    key: tuple[str, ...],
    destination: str | None,
    due_before: str | None,
    due_after: str | None,
    header: tuple[str, ...],
    key_prefix: str | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Cancel scheduled messages: by id or key (each answered), or by filter."""
    from rich.markup import escape

    from ..amqp.publisher import Publisher
    from ..core.journal.reading import require_journal

    filters = {
        "destination": destination,
        "due_before": time_value(due_before, "--due-before", or_duration=True),
        "due_after": time_value(due_after, "--due-after", or_duration=True),
        "headers": header_pairs(header),
        "key_prefix": key_prefix,
    }
    filtered = any(v is not None and v != {} for v in filters.values())
    if filtered and (message_ids or key):
        raise usage_error("give message ids or --key, or filters, not both")
    if not filtered and (dry_run or yes):
        raise usage_error("--dry-run and --yes go with filters (--destination, --due-before, ...)")
    if not message_ids and not key and not filtered:
        raise usage_error(
            "give message ids to cancel, --key KEY, or filters: --destination, --due-before, "
            "--due-after, --header KEY=VALUE, --key-prefix"
        )
    settings = settings_from(url, prefix, config)
    require_journal(settings.layout, "`cancel`")
    if filtered:
        _cancel_matching(settings, filters, dry_run=dry_run, yes=yes, as_json=as_json)
        return
    with Publisher(settings) as publisher:
        results = publisher.cancel(*message_ids, keys=key)
    for result in results:
        if as_json:
            print_json(result.to_json())
        else:
            out(emoji=False).print(escape(result.describe()), highlight=False)
    if any(r.outcome != "cancelled" for r in results):
        raise Exit(1)


def _cancel_matching(
    settings: Settings, filters: dict[str, Any], *, dry_run: bool, yes: bool, as_json: bool
) -> None:
    """A selective purge: the count first, asked when more than one and not --yes."""
    from rich.markup import escape

    from ..amqp.publisher import Publisher

    asked = sys.stdin.isatty() and not as_json

    def confirm(found: PurgeResult) -> bool:
        if yes or found.messages <= 1:
            return True
        if not asked:
            return False
        progress.close()
        err().print(escape(found.describe()), highlight=False)
        return click.confirm(f"Cancel these {found.messages:,} messages?", err=True)

    progress = _ReadProgress(shown=not as_json)
    try:
        with Publisher(settings) as publisher:
            result = publisher.cancel_matching(
                **filters, dry_run=dry_run, confirm=confirm, progress=progress
            )
    finally:
        progress.close()
    if as_json:
        print_json(result.to_json())
    else:
        out(emoji=False).print(escape(result.describe()), highlight=False)
    if not result.confirmed:
        if not asked:
            err().print(
                "nothing cancelled: add --yes to cancel them (--dry-run counts only)",
                highlight=False,
            )
        raise Exit(1)


@click.command(
    "reschedule",
    cls=Command,
    epilog=epilog(
        "ID_OR_KEY is a message id or a key (its current message). A later time is one "
        "record in the schedule journal: the worker forwards the waiting copy when it "
        "comes out. An earlier time publishes a fresh copy from the body in the journal "
        "(journal_bodies, on by default). Either way a worker handles it once, at the new "
        "time. Exits 0 only when it was rescheduled; otherwise says why: handled, "
        "cancelled, due (already due), ignored or replaced (under its key), unknown.",
        "rmqdelay reschedule order-42 --delay 2h",
        "rmqdelay reschedule 3f2b... --at 2026-12-01T09:00:00Z --json",
    ),
)
@argument("id_or_key", help="A message id, or a key.")
@delay_option("The new due time from now")
@at_option("The new due time")
@alias("--in", "delay_in", target="delay", new="--delay")
@json_option(lines=False)
@broker_options
@friendly_errors
def reschedule_command(
    id_or_key: str,
    delay: str | None,
    at: str | None,
    as_json: bool,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Move a scheduled message to a new due time."""
    from rich.markup import escape

    from ..amqp.publisher import Publisher
    from ..core.journal.reading import require_journal

    if (delay is None) == (at is None):
        raise usage_error("give exactly one of --delay or --at")
    if delay is not None:
        duration_us(delay, "--delay")
    due_at = time_value(at)
    settings = settings_from(url, prefix, config)
    require_journal(settings.layout, "`reschedule`")
    with Publisher(settings) as publisher:
        result = publisher.reschedule(id_or_key, delay=delay, at=due_at)
    if as_json:
        print_json(result.to_json())
    else:
        out(emoji=False).print(escape(result.describe()), highlight=False)
    if result.outcome != "rescheduled":
        raise Exit(1)
