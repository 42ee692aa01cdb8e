"""``scheduled list``'s rows as text, streamed: JSON lines, or plain aligned columns.

100,000 rows through rich's table took 0.42 ms of CPU a row (49.6 s) and held every
rendered cell until the end; ``json.dumps`` of a dict per row was most of the ``--json``
time. Here each row is one string built from the record and written in chunks as it
goes. rich still draws a small table on a terminal (:data:`RICH_ROWS`), as every
command's table (:mod:`.output`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple

from ..core.clock import iso_of_ms
from ..core.journal.records import json_text as _quote
from . import output

if TYPE_CHECKING:
    from rich.console import Console

    from ..core.journal.records import JournalRecord

__all__ = [
    "RICH_ROWS",
    "Row",
    "json_line",
    "json_lines",
    "numbered",
    "plain_table",
    "print_table",
    "write_lines",
]

RICH_ROWS = 200
"""At most this many rows go through rich's table, and only on a terminal."""
CHUNK = 1000
"""Lines per write: few system calls, and memory that does not grow with the rows."""
RIGHT = ("attempt", "bytes", "gen", "copy")
"""The columns of numbers, aligned to the right."""
RECURRING = "rmqdelay-recurring"
"""The header naming the recurring schedule a message is an occurrence of."""


class Row(NamedTuple):
    """One copy as ``scheduled list`` shows it: the record, its copy number among the
    copies of its id still ahead, how many there are, and its key's generation."""

    record: JournalRecord
    copy: int
    copies: int
    generation: int | None


def numbered(
    rows: Iterable[tuple[JournalRecord, int | None]], copies: Mapping[str, int]
) -> Iterator[Row]:
    """Each copy (soonest first) with its number among its id's copies, and their count."""
    seen: dict[str, int] = {}
    for record, generation in rows:
        copy = seen[record.message_id] = seen.get(record.message_id, 0) + 1
        yield Row(record, copy, copies[record.message_id], generation)


def recurring_of(record: JournalRecord) -> str | None:
    """The recurring schedule a copy is an occurrence of (its ``rmqdelay-recurring``)."""
    name = record.headers.get(RECURRING) if record.headers else None
    return None if name is None else str(name)


def json_line(row: Row) -> str:
    """The row as one JSON object, as ``json.dumps(..., separators=(",", ":"))`` writes
    it; the usual copy (no headers, no key) without building a dict first (the same
    text: ``tests/unit/test_schedule_rows.py``)."""
    return _json_text(*row)


def json_lines(
    rows: Iterable[tuple[JournalRecord, int | None]], copies: Mapping[str, int]
) -> Iterator[str]:
    """:func:`json_line` of each of :func:`numbered`'s rows, without making the rows: an
    id with one copy (nearly all of them) is not counted again."""
    seen: dict[str, int] = {}
    for record, generation in rows:
        message_id = record.message_id
        count = copies[message_id]
        copy = 1
        if count > 1:
            copy = seen[message_id] = seen.get(message_id, 0) + 1
        yield _json_text(record, copy, count, generation)


def _json_text(r: JournalRecord, copy: int, copies: int, generation: int | None) -> str:
    if r.headers or r.key is not None:
        data = {
            "message_id": r.message_id,
            "destination": r.destination,
            "due_at_ms": r.due_at_ms,
            "attempt": r.attempt,
            "body_size": r.body_size,
            "headers": dict(r.headers),
            "copy": copy,
            "copies": copies,
            "key": r.key,
            "generation": generation,
            "recurring": recurring_of(r),
        }
        return json.dumps(data, separators=(",", ":"))
    # the numbers are ints: a record's decoder makes them so (int() each took 5 % here)
    return (
        f'{{"message_id":{_quote(r.message_id)},"destination":{_quote(r.destination)},'
        f'"due_at_ms":{r.due_at_ms},"attempt":{r.attempt},"body_size":{r.body_size},'
        f'"headers":{{}},"copy":{copy},"copies":{copies},"key":null,'
        f'"generation":{"null" if generation is None else generation},"recurring":null}}'
    )


_SECONDS: dict[int, str] = {}


def iso_ms(ms: int) -> str:
    """:func:`~rmqdelay.core.clock.iso_of_ms`, the same text, with each second's
    date and time formatted once: many copies fall due within the same second."""
    second, milli = divmod(ms, 1000)
    head = _SECONDS.get(second)
    if head is None:
        if len(_SECONDS) > 100_000:
            _SECONDS.clear()
        head = _SECONDS[second] = iso_of_ms(second * 1000, "seconds")[:-6]
    return f"{head}.{milli:03d}+00:00"


def _shown(text: str) -> str:
    """A cell on one line: control characters (a newline in an id) as escapes."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def table_columns(rows: list[Row]) -> tuple[list[str], Callable[[Row], list[str]]]:
    """The column titles for these rows, and each row's cells: key and gen when any row
    has a key, recurring when any is an occurrence, copy when any id has several."""
    keyed = any(row.record.key is not None for row in rows)
    recurring = any(recurring_of(row.record) is not None for row in rows)
    several = any(row.copies > 1 for row in rows)
    titles = ["due at (UTC)", "destination", "message id", "attempt", "bytes"]
    titles += [*(["key", "gen"] if keyed else []), *(["recurring"] if recurring else [])]
    titles += ["copy"] if several else []

    def cells(row: Row) -> list[str]:
        r = row.record
        found = [
            iso_ms(r.due_at_ms),
            _shown(r.destination),
            _shown(r.message_id),
            str(r.attempt),
            str(r.body_size),
        ]
        if keyed:
            found += [_shown(r.key or ""), str(row.generation or "")]
        if recurring:
            found.append(_shown(recurring_of(r) or ""))
        if several:
            found.append(f"{row.copy}/{row.copies}")
        return found

    return titles, cells


def plain_table(rows: list[Row]) -> Iterator[str]:
    """The rows as aligned columns (two spaces apart, numbers to the right) under a
    title line and a rule. Widths are measured on the rows first (cheap next to
    rendering); a wide character (CJK) counts as one column here."""
    titles, cells = table_columns(rows)
    widths = [len(t) for t in titles]
    for i, title in enumerate(titles):
        if title == "due at (UTC)":
            widths[i] = max(widths[i], len(iso_ms(0)))  # every due time is this long
            continue
        widths[i] = max([widths[i], *(len(c) for c in _column(rows, cells, i))])
    line = output.aligned(titles, widths, RIGHT)
    yield line(*titles).rstrip()
    yield line(*("-" * w for w in widths)).rstrip()
    for row in rows:
        yield line(*cells(row)).rstrip()


def _column(rows: list[Row], cells: Callable[[Row], list[str]], i: int) -> Iterator[str]:
    """Column ``i``'s cells, built the cheap way for the wide ones."""
    if i == 1:
        return (_shown(row.record.destination) for row in rows)
    if i == 2:
        return (_shown(row.record.message_id) for row in rows)
    if i in (3, 4):
        return (str(row.record.attempt if i == 3 else row.record.body_size) for row in rows)
    return (cells(row)[i] for row in rows)


def write_lines(lines: Iterable[str], write: Callable[[str], object]) -> int:
    """Write lines :data:`CHUNK` at a time; how many were written."""
    count = 0
    chunk: list[str] = []
    for text in lines:
        chunk.append(text)
        if len(chunk) == CHUNK:
            write("\n".join(chunk) + "\n")
            count += len(chunk)
            chunk.clear()
    if chunk:
        write("\n".join(chunk) + "\n")
        count += len(chunk)
    return count


def print_table(shown: list[Row], console: Console) -> None:
    """The rows as a table (rich's on a terminal, when few), then how many."""
    several = len({r.record.message_id for r in shown if r.copies > 1})
    if console.is_terminal and len(shown) <= RICH_ROWS:
        titles, cells = table_columns(shown)
        rows = [cells(row) for row in shown]
        output.print_table(titles, rows, right=RIGHT, console=console)
    else:
        write_lines(plain_table(shown), sys.stdout.write)
    summary = f"{len(shown)} scheduled"
    if several:
        summary += f" ({several} message id(s) with more than one copy ahead)"
    console.print(summary)
