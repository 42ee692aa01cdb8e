"""``rmqdelay scheduled list`` and ``rmqdelay cancel``: the schedule journal, read and used."""

from __future__ import annotations

import gc
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING

import click
from click.exceptions import Exit

from ..core.clock import datetime_of_ms, iso_of_ms, now_ms
from ..errors import DelayError
from .options import (
    Command,
    Group,
    argument,
    broker_options,
    epilog,
    err,
    friendly_errors,
    out,
    settings_from,
    usage_error,
)

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from ..core.journal.reschedule import RescheduleResult
    from ..core.journal.view import CancelResult

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


def _due_before(text: str | None, option: str = "--due-before") -> datetime | None:
    """``--due-before``: an ISO 8601 time, or a duration from now such as ``10m``; a usage
    error naming *option* otherwise (the dashboard's time fields read the same)."""
    if text is None:
        return None
    from ..core.durations import parse_duration_us

    try:
        return datetime_of_ms(now_ms() + parse_duration_us(text) // 1000)
    except DelayError:
        pass
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise usage_error(
            f"{option} {text!r} is neither a duration (10m) nor ISO 8601 "
            "(2026-11-21T15:00:00+00:00)"
        ) from None
    if at.tzinfo is None:
        raise usage_error(f"{option} {text!r} has no timezone: add one, e.g. +00:00 or Z")
    return at


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
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
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

    before = _due_before(due_before)
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
@click.option("--json", "as_json", is_flag=True, help="What was written, as one JSON object.")
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
        print(json.dumps({**pointer.to_json(), **said, "gap": written.gap}))
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
        "is then free for the next publish).",
        "rmqdelay cancel 3f2b... 9c1d... --json",
        "rmqdelay cancel --key order-42",
    ),
)
@argument("message_ids", nargs=-1, required=False, help="Message ids to cancel.")
@click.option("--key", "keys", multiple=True, metavar="KEY", help="A key to cancel; repeat.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per id.")
@broker_options
@friendly_errors
def cancel_command(
    message_ids: tuple[str, ...],
    keys: tuple[str, ...],
    as_json: bool,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Cancel scheduled messages: say for each id cancelled, unknown, or too late."""
    from rich.markup import escape

    from ..amqp.publisher import Publisher
    from ..core.journal.reading import require_journal

    if not message_ids and not keys:
        raise usage_error("give message ids to cancel, or --key KEY")
    settings = settings_from(url, prefix, config)
    require_journal(settings.layout, "`cancel`")
    with Publisher(settings) as publisher:
        results = publisher.cancel(*message_ids, keys=keys)
    for result in results:
        if as_json:
            print(json.dumps(result.to_json(), separators=(",", ":")))
        elif result.key is not None:
            what = f"key {escape(result.key)}"
            if result.message_id:
                what += f" ({escape(result.message_id)})"
            said = _said(result)
            if not result.message_id:
                said = "unknown (no message with this key in the schedule journal)"
            out(emoji=False).print(f"{what}: {said}")
        else:
            out(emoji=False).print(f"{escape(result.message_id)}: {_said(result)}")
    if any(r.outcome != "cancelled" for r in results):
        raise Exit(1)


def _said(result: CancelResult) -> str:
    """A cancel's answer in words: how many copies it stopped when there were several."""
    ahead = result.cancelled_due_ms or ((result.due_at_ms,) if result.due_at_ms is not None else ())
    if result.outcome == "cancelled" and ahead:
        due = ", ".join(iso_of_ms(ms) for ms in ahead)
        if len(ahead) == 1:
            said = f"cancelled (was due {due}"
        else:
            said = f"cancelled {len(ahead)} copies (were due {due}"
        past = result.copies - len(ahead)
        return said + (f"; {past} more already due)" if past > 0 else ")")
    if result.outcome == "too late" and result.due_at_ms is not None:
        due = iso_of_ms(result.due_at_ms)
        if result.copies > 1:
            return (
                f"too late (all {result.copies} copies due, the last {due}; "
                "they may have been delivered)"
            )
        return f"too late (due {due}; it may have been delivered)"
    return "unknown (no record in the schedule journal)"


@click.command(
    "reschedule",
    cls=Command,
    epilog=epilog(
        "ID_OR_KEY is a message id or a key (its current message). A later time is one "
        "record in the schedule journal: the worker forwards the waiting copy when it "
        "comes out. An earlier time publishes a fresh copy from the body in the journal, "
        "so the message must have been published with journal_bodies = true. Either way a "
        "worker handles it once, at the new time. Exits 0 only when it was rescheduled; "
        "otherwise says why: handled, cancelled, due (already due), ignored or replaced "
        "(under its key), unknown.",
        "rmqdelay reschedule order-42 --in 2h",
        "rmqdelay reschedule 3f2b... --at 2026-12-01T09:00:00Z --json",
    ),
)
@argument("id_or_key", help="A message id, or a key.")
@click.option("--in", "delay", metavar="DURATION", help="The new due time from now: 15m, 2h.")
@click.option("--at", metavar="TIME", help="The new due time, ISO 8601 with a timezone.")
@click.option("--json", "as_json", is_flag=True, help="The result as one JSON object.")
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
    from .options import duration_us
    from .publish import _parse_at

    if (delay is None) == (at is None):
        raise usage_error("give exactly one of --in or --at")
    if delay is not None:
        duration_us(delay, "--in")
    due_at = _parse_at(at) if at is not None else None
    settings = settings_from(url, prefix, config)
    require_journal(settings.layout, "`reschedule`")
    with Publisher(settings) as publisher:
        result = publisher.reschedule(id_or_key, delay=delay, at=due_at)
    if as_json:
        print(json.dumps(result.to_json(), separators=(",", ":")))
    else:
        out(emoji=False).print(f"{escape(id_or_key)}: {escape(_moved(result))}")
    if result.outcome != "rescheduled":
        raise Exit(1)


def _moved(result: RescheduleResult) -> str:
    """A reschedule's answer in words."""
    who = ""
    if result.message_id is not None and result.message_id != result.target:
        who = f" ({result.message_id})"
    before = iso_of_ms(result.previous_due_ms) if result.previous_due_ms is not None else "?"
    if result.outcome == "rescheduled" and result.due_at_ms is not None:
        how = "a fresh copy was published" if result.fresh_copy else "the waiting copy is forwarded"
        return f"rescheduled{who} from {before} to {iso_of_ms(result.due_at_ms)} ({how})"
    return {
        "handled": f"not rescheduled{who}: already handled",
        "cancelled": f"not rescheduled{who}: it was cancelled",
        "due": f"not rescheduled{who}: already due ({before}): handled or on its way",
        "ignored": f"not rescheduled{who}: that publish was ignored (its key was pending)",
        "replaced": f"not rescheduled{who}: it was replaced under its key",
        "unknown": "unknown (no message with this id or key in the schedule journal)",
    }.get(result.outcome, result.outcome)
