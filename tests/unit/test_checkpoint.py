"""A checkpoint loaded and the tail folded answers every query as folding the whole journal.

The model is the whole journal folded in order by one :class:`JournalState`, forgetting
what is settled at each checkpoint's time (as the checkpoint's writer does). Against it:

- a checkpoint written at each position, read back from its bytes, and the rest folded;
- each reader's part of it: a worker's (tombstones, keys and recurring schedules, no
  copy), a cancel's or a reschedule's (the copies of the ids it asks about);
- a writer's new checkpoint: the previous one's core restored, the tail folded, the
  copies merged part by part with the previous ones;
- and forgetting what is settled changes no answer about what is still relevant.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rmqdelay.core.journal.checkpoint import SETTLE_MS, decode_copies, decode_entries
from rmqdelay.core.journal.keys import recurring_key
from rmqdelay.core.journal.records import (
    JournalRecord,
    decode_records,
    encode_record,
    encode_records,
)
from rmqdelay.core.journal.recurring import control_record
from rmqdelay.core.journal.reschedule import plan_reschedule
from rmqdelay.core.journal.rules import RECURRING, Occurrence, RecurringOp, Rule
from rmqdelay.core.journal.state import JournalState, Restorer, copies_merge, write_sections
from rmqdelay.core.journal.tombstones import Tombstones
from rmqdelay.core.journal.view import plan_cancels

MIN = 60_000
T0 = 1_800_000_000_000
IDS = ["m0", "m1", "m2", "m.3"]
KEYED_IDS = [f"{i}/{k}" for i in ["m0", "m1", "m2", "m.3"] for k in ["k0", "k1"]]
ALL = [*IDS, *KEYED_IDS]
KEYS = ["k0", "k1"]
DESTINATIONS = ["a", "b"]
NAMES = ["r0", "r1"]
RULE = Rule(every_ms=5 * MIN)
CHAINS = [f"{T0 + k * MIN}-c{k}" for k in range(3)]
OCCURRENCES = [
    Occurrence(n, T0 + k * 5 * MIN, RULE, c) for n in NAMES for c in CHAINS for k in (0, 4, 9)
]
HORIZON = 30 * MIN
"""The longest delay the tests' states are expired with (removed schedules' horizon)."""


def due(step: int) -> int:
    return T0 + step * MIN


@st.composite
def a_record(draw: st.DrawFn, at: int, low: int = -15) -> JournalRecord:
    """One record of any kind, recorded at about ``at`` (a publisher's clock), about
    copies due from ``due(low)`` on."""
    kind = draw(
        st.sampled_from(
            ["scheduled"] * 6
            + ["occurrence"] * 2
            + ["cancelled", "claimed", "done", "rescheduled", "recurring", "marker"] * 2
        )
    )
    message_id = draw(st.sampled_from(IDS))
    destination = draw(st.sampled_from(DESTINATIONS))
    when = due(draw(st.integers(low, 60)))
    key = draw(st.sampled_from([None, None, *KEYS]))
    if key is not None or kind in ("claimed", "done"):
        key = key or draw(st.sampled_from(KEYS))
        message_id = f"{message_id}/{key}"  # a message has one key, or none
    elif kind == "cancelled" and draw(st.booleans()):
        message_id = f"{message_id}/{draw(st.sampled_from(KEYS))}"
    dues = tuple(due(d) for d in draw(st.lists(st.integers(low, 60), max_size=3)))
    if kind == "scheduled":
        with_body = draw(st.booleans())
        return JournalRecord(
            "scheduled",
            message_id,
            destination,
            when,
            attempt=draw(st.integers(1, 3)),
            body_size=3,
            headers=draw(st.sampled_from([{}, {"x-h": "v"}])),
            recorded_at_ms=at,
            body=b"abc" if with_body else None,
            properties={"content_type": "text/plain"} if with_body else {},
            key=key,
            on_conflict=draw(st.sampled_from([None, "ignore", "replace"])) if key else None,
        )
    if kind == "occurrence":
        occurrence = draw(st.sampled_from(OCCURRENCES))
        state: Literal["active", "paused"] = draw(st.sampled_from(["active", "paused"]))
        stamp = at - draw(st.integers(0, 3)) * MIN
        headers = Occurrence(
            occurrence.name, occurrence.at_ms, RULE, occurrence.chain, state, stamp
        ).headers()
        okey = recurring_key(occurrence.name, occurrence.at_ms)
        return JournalRecord(
            "scheduled",
            f"{okey}:{occurrence.chain}",
            destination,
            occurrence.at_ms,
            headers=headers,
            recorded_at_ms=at,
            key=okey,
            on_conflict="ignore",
        )
    if kind == "cancelled":
        return JournalRecord(
            "cancelled", message_id, destination, when, recorded_at_ms=at, cancels_due_ms=dues
        )
    if kind in ("claimed", "done"):
        return JournalRecord(
            "claimed" if kind == "claimed" else "done",
            message_id,
            destination,
            when,
            recorded_at_ms=at,
            key=key,
            worker=draw(st.sampled_from(["w1", "w2"])),
            claim_id=draw(st.sampled_from(["c1", "c2"])) if kind == "claimed" else "",
        )
    if kind == "rescheduled":
        return JournalRecord(
            "rescheduled",
            message_id,
            destination,
            when,
            recorded_at_ms=at,
            cancels_due_ms=dues,
            key=key,
            fresh_copy=draw(st.booleans()),
        )
    if kind == "recurring":
        name = draw(st.sampled_from(NAMES))
        op: RecurringOp = draw(st.sampled_from(["add", "pause", "resume", "remove"]))
        chain = draw(st.sampled_from(CHAINS))
        return control_record(name, op, at, rule=RULE, chain=chain, destination=destination)
    return JournalRecord("marker", f"marker-{at}", recorded_at_ms=at)


@dataclass(frozen=True)
class Journal:
    records: list[JournalRecord]
    checkpoints: dict[int, int]
    """Position (a checkpoint covers the records before it) -> its writer's time."""
    now: int


@st.composite
def journals(draw: st.DrawFn, max_checkpoints: int = 3) -> Journal:
    size = draw(st.integers(0, 45))
    records = []
    clock = T0 - 20 * MIN
    for _ in range(size):
        clock += draw(st.integers(0, 4)) * MIN // 2
        records.append(draw(a_record(clock + draw(st.integers(-2, 2)) * MIN)))
    positions = sorted(draw(st.sets(st.integers(0, size), min_size=1, max_size=max_checkpoints)))
    checkpoints: dict[int, int] = {}
    last = T0 - 30 * MIN
    for position in positions:
        written = records[position - 1].recorded_at_ms if position else T0 - 30 * MIN
        last = max(last, written + draw(st.integers(0, 20)) * MIN)
        checkpoints[position] = last
    now = last + draw(st.integers(0, 20)) * MIN
    return Journal(records, checkpoints, now)


@st.composite
def timely_journals(draw: st.DrawFn) -> Journal:
    """One checkpoint, then a tail as the journal holds it when clocks are right: each
    record written within the margin of the checkpoint's time, about copies not settled
    before it (a retry, a cancel or a move names a copy a reader could still see)."""
    journal = draw(journals(max_checkpoints=1))
    ((position, at),) = journal.checkpoints.items()
    low = (at - SETTLE_MS - T0) // MIN + 1
    # what the checkpoint forgot (every copy, claim and move due before the margin) is
    # never spoken of again: a handling later than the margin is what it rules out
    before = folded(Journal(journal.records[:position], {}, at))
    after = folded(journal, position)
    settled = _known(before) - _known(after)
    tail: list[JournalRecord] = []
    clock = at - SETTLE_MS // 2
    for _ in range(draw(st.integers(0, 15))):
        clock += draw(st.integers(0, 4)) * MIN // 2
        record = draw(a_record(clock, low=min(low, 60)))
        first = record.on_conflict is not None and RECURRING not in record.headers
        if first or record.message_id in settled:
            # a first publish is a new message (a publisher that names its ids names a
            # new one), and a settled one is never spoken of again
            record = replace(record, message_id=f"{record.message_id}-{len(tail)}")
        if record.kind == "recurring" and record.data["op"] == "add":
            # an add starts a chain as it is written (its id begins with that time)
            data = {**record.data, "chain": f"{record.recorded_at_ms}-t{len(tail)}"}
            record = replace(record, data=data)
        tail.append(record)
    now = max(journal.now, clock)
    return Journal([*journal.records[:position], *tail], journal.checkpoints, now)


# ------------------------------------------------------------------------ helpers


def folded(journal: Journal, upto: int | None = None) -> JournalState:
    """The model: every record in order, forgetting what is settled at each checkpoint."""
    state = JournalState()
    end = len(journal.records) if upto is None else upto
    for i, record in enumerate(journal.records[:end]):
        if i in journal.checkpoints:
            state.expire(journal.checkpoints[i], HORIZON)
        state.add(record)
    if end in journal.checkpoints:
        state.expire(journal.checkpoints[end], HORIZON)
    return state


def written(state: JournalState) -> list[tuple[str, bytes]]:
    """A state as a checkpoint's parts, through their bytes."""
    return [(section, body) for section, body, _count in write_sections(state)]


def read_back(parts: Sequence[tuple[str, bytes]], restorer: Restorer) -> JournalState:
    for section, body in parts:
        restorer.take(section, body)
    return restorer.state


def through_bytes(records: Sequence[JournalRecord]) -> list[JournalRecord]:
    """Records as a reader gets them from the stream (encoded, decoded)."""
    return decode_records(encode_records(records)) if records else []


def occurrence_ids() -> list[str]:
    return [f"{recurring_key(o.name, o.at_ms)}:{o.chain}" for o in OCCURRENCES]


def answers(state: JournalState, now: int, ids: Sequence[str] | None = None) -> dict[str, Any]:
    """Every question a reader asks of the state, answered, comparably."""
    view, recurring = state.view, state.recurring
    ids = [*IDS, *KEYED_IDS, *occurrence_ids()] if ids is None else ids
    out: dict[str, Any] = {}
    if ids is not None and view.loaded is None:
        out["pending"] = [encode_record(r) for r in view.pending(now)]
        out["pending a"] = [r.message_id for r in view.pending(now, destination="a", limit=3)]
    out["ids"] = {
        i: (
            view.answer(i, now)[0],
            [encode_record(r) for r in view.copies_of(i)],
            [view.is_cancelled(i, r.due_at_ms) for r in view.copies_of(i)],
        )
        for i in ids
    }
    results, tombstones = plan_cancels(view, ids, now)
    out["cancel"] = ([r.to_json() for r in results], [encode_record(t) for t in tombstones])
    out["reschedule"] = [
        (plan.result, None if plan.record is None else encode_record(plan.record))
        for i in ids
        for new_due in (now + MIN, now + 90 * MIN)
        for plan in [plan_reschedule(view, i, new_due, now)]
    ]
    out["keys"] = answers_of_keys(state, now, ids)
    out["recurring"] = (
        [repr(s) + s.state for s in recurring.listed(include_removed=True)],
        recurring.counts(),
        [recurring.decide(o) for o in OCCURRENCES],
    )
    return out


def answers_of_keys(state: JournalState, now: int, ids: Sequence[str]) -> dict[str, Any]:
    book = state.view.keys
    keys = [*KEYS, *(recurring_key(o.name, o.at_ms) for o in OCCURRENCES)]
    return {
        "status": {i: (book.status(i, now), repr(book.outcome(i)), book.hides(i)) for i in ids},
        "keys": {k: (repr(book.current(k)), repr(book.pending(k, now))) for k in keys},
        "pending keys": book.pending_keys(now),
        "moves": {
            i: (m.due_ms, sorted(m.old_due_ms), m.fresh_copy)
            for i in ids
            if (m := book.moves.get(i)) is not None
        },
        "verdicts": [
            repr(book.verdict(i, d, k, redelivered=r, now_ms=now, claim_id=c))
            for i in ids
            for d in (None, due(0), due(30), now)
            for k in (None, *KEYS[:1])
            for r in (False, True)
            for c in ("", "c1")
        ],
    }


def tail_of(journal: Journal, position: int) -> list[JournalRecord]:
    return through_bytes(journal.records[position:])


def last_checkpoint(journal: Journal) -> tuple[int, int]:
    position = max(journal.checkpoints)
    return position, journal.checkpoints[position]


# ------------------------------------------------------------------------ the properties

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(journals())
def test_a_checkpoint_read_back_and_the_tail_answer_as_the_whole_journal(journal: Journal) -> None:
    model = folded(journal)
    # each checkpoint written from what was folded up to it, read back from its bytes,
    # and the journal folded on from there, to the next checkpoint
    state = JournalState()
    done = 0
    for position, at in sorted(journal.checkpoints.items()):
        for record in through_bytes(journal.records[done:position]):
            state.add(record)
        state.expire(at, HORIZON)
        state = read_back(written(state), Restorer(JournalState()))
        done = position
    for record in tail_of(journal, done):
        state.add(record)
    assert answers(state, journal.now) == answers(model, journal.now)
    assert written(state) == written(model)


@SETTINGS
@given(journals())
def test_each_reader_loads_only_its_part_and_answers_as_the_whole(journal: Journal) -> None:
    position, _at = last_checkpoint(journal)
    model = folded(journal)
    parts = written(folded(journal, position))
    tail = tail_of(journal, position)
    now = journal.now

    # a worker: the core section alone (no copy), into its own folds
    core = [(s, b) for s, b in parts if s == "core"]
    tombstones = Tombstones()
    worker = read_back(core, Restorer(JournalState(), ids=()))
    assert worker.view.copies == {}
    for _section, body in core:
        for entry in decode_entries(body):
            tombstones.restore(entry)
    for record in tail:
        tombstones.add(record)
        worker.add(record)
    reference = Tombstones()
    for record in journal.records:
        reference.add(record)
    dues = [None, *(due(d) for d in range(-15, 61, 5)), now, now - 30_000]
    assert [tombstones.is_cancelled(i, now, d) for i in ALL for d in dues] == [
        reference.is_cancelled(i, now, d) for i in ALL for d in dues
    ]
    assert answers_of_keys(worker, now, ALL) == answers_of_keys(model, now, ALL)

    # a cancel, a reschedule: the copies of the ids asked about, then the tail
    for asked in ([IDS[0]], [IDS[1], KEYED_IDS[2]], KEYED_IDS[4:6], occurrence_ids()[:2]):
        reader = read_back(parts, Restorer(JournalState(), ids=asked))
        for record in tail:
            reader.add(record)
        ours = {k: v for k, v in reader.view.copies.items() if k[0] in asked}
        assert ours == {k: v for k, v in model.view.copies.items() if k[0] in asked}
        mine, whole = answers(reader, now, asked), answers(model, now, asked)
        assert mine["ids"] == whole["ids"]
        assert mine["cancel"] == whole["cancel"]
        assert mine["reschedule"] == whole["reschedule"]


@SETTINGS
@given(journals(max_checkpoints=2), st.integers(1, 3))
def test_a_writer_merges_the_previous_checkpoint_with_the_tail_part_by_part(
    journal: Journal, part_copies: int
) -> None:
    """The writer holds the previous checkpoint's core and the tail, never its copies:
    it restores the core, folds the tail (moves of copies it has not read wait), loads
    the copies of the ids those moves name, and merges the rest as it reads them."""
    first, last = min(journal.checkpoints), max(journal.checkpoints)
    if first == last:
        return
    twice = Journal(
        journal.records,
        {first: journal.checkpoints[first], last: journal.checkpoints[last]},
        journal.now,
    )
    previous = written(folded(twice, first))
    writer = read_back(
        [(s, b) for s, b in previous if s == "core"], Restorer(JournalState(), ids=())
    )
    for record in through_bytes(twice.records[first:last]):
        writer.add(record)
    wanted = set(writer.view.deferred)
    old_copies = [r for s, b in previous if s == "copies" for r in decode_copies(b)]
    old_bodies = [e for s, b in previous if s == "bodies" for e in decode_entries(b)]
    loading = Restorer(JournalState(), ids=wanted)
    read_back([(s, b) for s, b in previous if s != "core"], loading)
    writer.view.load(wanted, loading.state.view.copies.values())
    at = twice.checkpoints[last]
    writer.expire(at, HORIZON)
    copies, bodies = copies_merge(writer.view, at - SETTLE_MS)
    merged = [r for chunk in _chunks(old_copies, part_copies) for r in copies.feed(chunk)]
    merged += copies.finish()
    merged_bodies = [e for chunk in _chunks(old_bodies, part_copies) for e in bodies.feed(chunk)]
    merged_bodies += bodies.finish()

    model = folded(twice, last)
    expected = [r for s, b in written(model) if s == "copies" for r in decode_copies(b)]
    assert [encode_record(r) for r in _without_bodies(merged)] == [
        encode_record(r) for r in expected
    ]
    assert merged_bodies == [
        e for s, b in written(model) if s == "bodies" for e in decode_entries(b)
    ]
    assert sorted(map(repr, writer.core_entries())) == sorted(map(repr, model.core_entries()))


def _settled_then_recorded_again(again_due: int, *, lost: bool = False) -> Journal:
    """A keyed message replaced (or, ``lost``, ignored), a tombstone naming a later copy
    of it, its key's generations all settled at the checkpoint; after it, that copy (or
    a later one) recorded again. The tombstone keeps the id known past the checkpoint,
    so the key book must keep what it knows of the id too."""
    at = T0 + 21 * MIN // 2

    def publish(message_id: str, on_conflict: Any, written: int) -> JournalRecord:
        return JournalRecord(
            "scheduled",
            message_id,
            "a",
            T0,
            key="k0",
            on_conflict=on_conflict,
            recorded_at_ms=T0 + written * MIN // 2,
        )

    tombstone = JournalRecord("cancelled", "m1/k0", "a", due(1), recorded_at_ms=T0 - 18 * MIN)
    if lost:
        before = [publish("m0/k0", "ignore", -40), publish("m1/k0", "ignore", -36), tombstone]
    else:
        before = [publish("m1/k0", None, -40), tombstone, publish("m0/k0", "replace", -3)]
    again = replace(publish("m1/k0", None, 11), due_at_ms=again_due)
    return Journal([*before, again], {3: at}, at)


@SETTINGS
@given(timely_journals())
@example(_settled_then_recorded_again(due(1))).via("a worker's verdict: replaced, not claim")
@example(_settled_then_recorded_again(due(11))).via("pending: hidden as replaced")
@example(_settled_then_recorded_again(due(11), lost=True)).via("pending: hidden as ignored")
def test_forgetting_what_is_settled_changes_no_answer_about_what_is_relevant(
    journal: Journal,
) -> None:
    """What a checkpoint leaves out (due more than the margin before it) is never
    listed, never cancelled, and no worker's verdict: answers about the rest agree with
    a fold that forgot nothing."""
    _position, at = last_checkpoint(journal)
    forgot = folded(journal)
    kept = JournalState()
    for record in journal.records:
        kept.add(record)
    now = journal.now
    assert [encode_record(r) for r in forgot.view.pending(now)] == [
        encode_record(r) for r in kept.view.pending(now)
    ]
    cutoff = at - SETTLE_MS
    # ids with a copy still within the margin: cancel and reschedule answer alike
    live = [i for i in ALL if any(r.due_at_ms >= cutoff for r in kept.view.copies_of(i))]
    for i in live:
        assert [encode_record(r) for r in forgot.view.copies_of(i) if r.due_at_ms >= cutoff] == [
            encode_record(r) for r in kept.view.copies_of(i) if r.due_at_ms >= cutoff
        ]
        assert forgot.view.answer(i, now)[0] == kept.view.answer(i, now)[0]
    # a worker's verdict on each recorded copy due within the margin, as delivered
    for (i, d), record in kept.view.copies.items():
        if d >= cutoff:
            for redelivered in (False, True):
                mine = forgot.view.keys.verdict(
                    i, d, record.key, redelivered=redelivered, now_ms=now
                )
                theirs = kept.view.keys.verdict(
                    i, d, record.key, redelivered=redelivered, now_ms=now
                )
                assert (mine.action, mine.reason) == (theirs.action, theirs.reason)
    assert [s.name for s in forgot.recurring.listed()] == [s.name for s in kept.recurring.listed()]
    assert forgot.recurring.counts() == kept.recurring.counts()


def _known(state: JournalState) -> set[str]:
    """The ids a state holds anything of."""
    view = state.view
    return (
        {i for i, _due in view.copies}
        | set(view.cancelled)
        | set(view.keys.by_id)
        | set(view.keys.moves)
    )


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _without_bodies(records: list[JournalRecord]) -> list[JournalRecord]:
    from rmqdelay.core.journal.checkpoint import without_body

    return [without_body(r) for r in records]


@SETTINGS
@given(journals(max_checkpoints=1), st.lists(st.sampled_from(ALL), min_size=1, max_size=3))
@example(  # a keyed copy's tombstone names no key, and settles the key's generation
    Journal(
        [
            JournalRecord("scheduled", "m0/k0", "a", T0, key="k0", recorded_at_ms=T0 - MIN),
            JournalRecord("cancelled", "m0/k0", "a", T0, recorded_at_ms=T0 - MIN),
        ],
        {0: T0 - 10 * MIN},
        T0 - 10 * MIN,
    ),
    ["m0"],
)
def test_a_cancel_folds_only_the_tail_lines_about_its_ids_and_answers_the_same(
    journal: Journal, asked: list[str]
) -> None:
    """A cancel's tail is read filtered (flows._about): the plain records of other
    messages are skipped undecoded. Its answers and tombstones are those of the whole."""
    from rmqdelay.core.journal.flows import _about

    wants = _about(asked)
    whole, filtered = JournalState(), JournalState()
    for record in journal.records:
        whole.add(record)
        if wants(encode_record(record)):
            filtered.add(record)

    def said(state: JournalState) -> Any:
        results, tombstones = plan_cancels(state.view, asked, journal.now)
        return [r.to_json() for r in results], [encode_record(t) for t in tombstones]

    assert said(filtered) == said(whole)
    for key in KEYS:
        assert repr(filtered.view.keys.current(key)) == repr(whole.view.keys.current(key))
