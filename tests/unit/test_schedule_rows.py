"""``scheduled list``'s rows as text: the fast JSON line is ``json.dumps``'s, and the
plain table lines up every column whatever the rows hold."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from rmqdelay.cli.schedule_rows import (
    RECURRING,
    Row,
    iso_ms,
    json_line,
    json_lines,
    numbered,
    plain_table,
    recurring_of,
    write_lines,
)
from rmqdelay.core.clock import iso_of_ms
from rmqdelay.core.journal.records import JournalRecord

texts = st.text(max_size=12)
rows = st.builds(
    Row,
    record=st.builds(
        JournalRecord,
        kind=st.just("scheduled"),
        message_id=texts,
        destination=texts,
        due_at_ms=st.integers(0, 7 * 10**12),
        attempt=st.integers(1, 100),
        body_size=st.integers(0, 2**31),
        headers=st.just({})
        | st.dictionaries(st.sampled_from([RECURRING, "x"]), texts, min_size=1, max_size=2),
        key=st.none() | texts,
    ),
    copy=st.integers(1, 3),
    copies=st.integers(1, 3),
    generation=st.none() | st.integers(1, 50),
)


@given(rows)
def test_a_json_line_is_what_json_dumps_writes(row: Row) -> None:
    r = row.record
    expected = {
        "message_id": r.message_id,
        "destination": r.destination,
        "due_at_ms": r.due_at_ms,
        "attempt": r.attempt,
        "body_size": r.body_size,
        "headers": dict(r.headers),
        "copy": row.copy,
        "copies": row.copies,
        "key": r.key,
        "generation": row.generation,
        "recurring": recurring_of(r),
    }
    assert json_line(row) == json.dumps(expected, separators=(",", ":"))


@given(st.lists(rows, max_size=12), st.integers(1, 20))
def test_the_json_lines_are_the_numbered_rows_json_lines(found: list[Row], spread: int) -> None:
    """Ids repeat (a few shared ids), so copies are numbered in order as numbered() does."""
    pairs = [
        (replace(row.record, message_id=f"m{i % spread}"), row.generation)
        for i, row in enumerate(found)
    ]
    copies = Counter(record.message_id for record, _ in pairs)
    expected = [json_line(row) for row in numbered(pairs, copies)]
    assert list(json_lines(pairs, copies)) == expected


@given(st.lists(rows, min_size=1, max_size=20))
def test_the_plain_table_has_a_line_per_row_and_aligned_columns(found: list[Row]) -> None:
    lines = list(plain_table(found))
    assert len(lines) == len(found) + 2
    rule = lines[1]
    # each column's rule starts after the two spaces that end the one before
    starts = [i for i, c in enumerate(rule) if c == "-" and (i == 0 or rule[i - 1] == " ")]
    assert len(starts) == len(lines[0].split()) - 3  # "due at (UTC)", "message id": 3 spaces
    for row, text in zip(found, lines[2:], strict=True):
        assert text.startswith(iso_of_ms(row.record.due_at_ms))
        assert "\n" not in text
        # no cell runs into the next column: the two characters before each are the gap
        assert all(text[s - 2 : s] == "  " for s in starts[1:] if s < len(text))
    titles = lines[0]
    assert ("copy" in titles) == any(r.copies > 1 for r in found)
    assert ("key" in titles) == any(r.record.key is not None for r in found)
    assert ("recurring" in titles) == any(recurring_of(r.record) is not None for r in found)


def test_lines_are_written_in_chunks_and_all_of_them() -> None:
    writes: list[str] = []
    assert write_lines((str(i) for i in range(2500)), writes.append) == 2500
    assert len(writes) == 3
    assert "".join(writes).splitlines() == [str(i) for i in range(2500)]


@given(st.integers(0, 7 * 10**12))
def test_a_due_time_reads_as_iso_of_ms_writes_it(ms: int) -> None:
    """Up to the year 2191: past it, iso_of_ms's float seconds miss a millisecond."""
    assert iso_ms(ms) == iso_of_ms(ms)
