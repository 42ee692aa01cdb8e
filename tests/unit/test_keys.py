"""The keys fold: what the journal's order decides, the same for every reader."""

from __future__ import annotations

import copy
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from rmqdelay.core.journal.generations import Generation, Loser, book_entries
from rmqdelay.core.journal.keys import (
    UNRECORDED_GRACE_MS,
    KeyBook,
    recurring_key,
)
from rmqdelay.core.journal.records import JournalRecord, decode_record, encode_record
from rmqdelay.core.journal.reschedule import plan_reschedule
from rmqdelay.core.journal.view import ScheduleView, plan_cancels


def keyed(
    message_id: str,
    due: int,
    at: int,
    key: str = "k",
    mode: str | None = "ignore",
    attempt: int = 1,
    body: bytes | None = None,
) -> JournalRecord:
    return JournalRecord(
        "scheduled",
        message_id,
        "dest",
        due,
        attempt,
        recorded_at_ms=at,
        key=key,
        on_conflict=mode,  # type: ignore[arg-type]
        body=body,
    )


def claim(
    message_id: str, due: int, worker: str, cid: str, key: str = "k", attempt: int = 1
) -> JournalRecord:
    return JournalRecord(
        "claimed", message_id, "dest", due, attempt, key=key, worker=worker, claim_id=cid
    )


def done(message_id: str, due: int, key: str = "k") -> JournalRecord:
    return JournalRecord("done", message_id, "dest", due, key=key, worker="w")


# ---------------------------------------------------------------------- records


@given(
    key=st.none() | st.text(min_size=1, max_size=20),
    mode=st.none() | st.sampled_from(["ignore", "replace"]),
    worker=st.text(max_size=8),
    cid=st.text(max_size=8),
    fresh=st.booleans(),
    dues=st.lists(st.integers(0, 2**42), max_size=3),
    kind=st.sampled_from(["scheduled", "claimed", "done", "rescheduled", "recurring"]),
)
def test_new_fields_round_trip(key, mode, worker, cid, fresh, dues, kind) -> None:  # type: ignore[no-untyped-def]
    record = JournalRecord(
        kind,
        "id-1",
        "dest",
        5,
        recorded_at_ms=7,
        key=key,
        on_conflict=mode,
        worker=worker,
        claim_id=cid,
        fresh_copy=fresh,
        cancels_due_ms=tuple(dues),
        data={"op": "pause"} if kind == "recurring" else {},
    )
    assert decode_record(encode_record(record)) == record


def test_an_unkeyed_record_is_written_as_before() -> None:
    plain = JournalRecord("scheduled", "a", "d", 10, recorded_at_ms=1)
    assert b"key" not in encode_record(plain) and b'"m"' not in encode_record(plain)


# ---------------------------------------------------------------------- generations


def test_ignore_while_pending_loses_and_names_the_winner() -> None:
    book = KeyBook().extend([keyed("a", 1000, 10), keyed("b", 2000, 20)])
    outcome, entry = book.outcome("b")
    assert outcome == "ignored" and isinstance(entry, Loser)
    assert (entry.winner_id, entry.winner_due_ms, entry.due_ms) == ("a", 1000, 2000)
    assert book.outcome("a")[0] == "scheduled"
    assert book.verdict("b", 2000, "k", redelivered=False, now_ms=2000).action == "drop"


def test_replace_while_pending_supersedes_and_starts_the_next_generation() -> None:
    book = KeyBook().extend([keyed("a", 1000, 10), keyed("b", 2000, 20, mode="replace")])
    outcome, entry = book.outcome("b")
    assert outcome == "replaced" and isinstance(entry, Generation) and entry.number == 2
    verdict = book.verdict("a", 1000, "k", redelivered=False, now_ms=1000)
    assert (verdict.action, verdict.reason) == ("drop", "replaced")
    assert book.verdict("b", 2000, "k", redelivered=False, now_ms=2000).action == "claim"


def test_a_winner_already_due_holds_nothing() -> None:
    """Pending is judged at the new record's own time: a replace (or ignore) written
    after the winner fell due starts a new generation and supersedes nothing."""
    for mode in ("ignore", "replace"):
        book = KeyBook().extend([keyed("a", 1000, 10), keyed("b", 5000, 1000, mode=mode)])
        assert book.outcome("b")[0] == "scheduled"
        assert book.current("k").number == 2  # type: ignore[union-attr]
        assert book.verdict("a", 1000, "k", redelivered=False, now_ms=1000).action == "claim"


def test_cancelled_and_handled_winners_free_the_key() -> None:
    cancelled = KeyBook().extend(
        [keyed("a", 1000, 10), JournalRecord("cancelled", "a", "dest", 1000), keyed("b", 900, 20)]
    )
    assert cancelled.outcome("b")[0] == "scheduled"
    assert cancelled.verdict("a", 1000, "k", redelivered=False, now_ms=1000).action == "drop"
    handled = KeyBook().extend([keyed("a", 100, 10), done("a", 100), keyed("b", 900, 50)])
    assert handled.outcome("b")[0] == "scheduled"
    assert handled.status("a", 0) == "handled"


def test_retries_move_the_winner_and_keep_its_generation() -> None:
    book = KeyBook().extend([keyed("a", 1000, 10), keyed("a", 4000, 1100, mode=None, attempt=2)])
    generation = book.current("k")
    assert generation is not None and (generation.number, generation.due_ms) == (1, 4000)
    # while the retry waits, the key is still taken
    book.add(keyed("b", 9000, 2000))
    assert book.outcome("b")[0] == "ignored"


def test_keys_are_independent() -> None:
    book = KeyBook().extend([keyed("a", 1000, 10, key="x"), keyed("b", 1000, 10, key="y")])
    assert book.outcome("a")[0] == book.outcome("b")[0] == "scheduled"


def test_recurring_keys_name_the_occurrence() -> None:
    assert recurring_key("daily", 1_700_000_000_000) == "recurring:daily@1700000000000"


# ---------------------------------------------------------------------- claims


def test_the_first_claim_read_wins() -> None:
    book = KeyBook().extend([keyed("a", 1000, 10), claim("a", 1000, "w1", "c1")])
    book.add(claim("a", 1000, "w2", "c2"))
    first = book.verdict("a", 1000, "k", redelivered=False, now_ms=1000, claim_id="c1")
    second = book.verdict("a", 1000, "k", redelivered=False, now_ms=1000, claim_id="c2")
    assert first.action == "handle" and second.action == "drop"
    # a redelivered copy is taken over: its claimer may have died before ``done``
    taken = book.verdict("a", 1000, "k", redelivered=True, now_ms=1000)
    assert (taken.action, taken.reason) == ("handle", "taken over")
    book.add(done("a", 1000))
    assert book.verdict("a", 1000, "k", redelivered=True, now_ms=1000).reason == "duplicate"


def test_a_redelivered_copy_waits_for_a_claim_handled_in_its_own_worker() -> None:
    # two copies of one generation (a duplicate publish): the fresh one claimed it and its
    # handler runs in this worker, so the redelivered one must not take it over
    book = KeyBook().extend([keyed("a", 1000, 10), claim("a", 1000, "w1", "c1")])
    here = book.verdict("a", 1000, "k", redelivered=True, now_ms=1000, held_here={"c1"})
    assert (here.action, here.reason) == ("wait", "claimed here")
    other = book.verdict("a", 1000, "k", redelivered=True, now_ms=1000, held_here={"c9"})
    assert (other.action, other.reason) == ("handle", "taken over")
    book.add(done("a", 1000))
    after = book.verdict("a", 1000, "k", redelivered=True, now_ms=1000, held_here={"c1"})
    assert (after.action, after.reason) == ("drop", "duplicate")


def test_a_retry_copy_is_claimed_anew() -> None:
    book = KeyBook().extend(
        [
            keyed("a", 1000, 10),
            claim("a", 1000, "w1", "c1"),
            keyed("a", 3000, 1100, mode=None, attempt=2),
        ]
    )
    assert book.verdict("a", 3000, "k", redelivered=False, now_ms=3000, attempt=2).action == "claim"


def test_a_resend_due_when_sent_shares_the_claim_of_its_attempt() -> None:
    # a recurring chain's restarted worker publishes the next occurrence again after its
    # time: the resend is due when sent (1174), not at the first copy's 1000
    records = [keyed("a", 1000, 10), keyed("a", 1174, 1174)]
    for first, second in ((1000, 1174), (1174, 1000)):
        book = KeyBook().extend(
            [*records, claim("a", first, "w1", "c1"), claim("a", second, "w1", "c2")]
        )
        won = book.verdict("a", first, "k", redelivered=False, now_ms=1200, claim_id="c1")
        lost = book.verdict("a", second, "k", redelivered=False, now_ms=1200, claim_id="c2")
        assert won.action == "handle"
        assert (lost.action, lost.reason) == ("drop", "claimed elsewhere")
        # a checkpoint keeps which copy the attempt's claim was for
        restored = KeyBook()
        for entry in book_entries(book.generations, book.by_id, book.moves):
            restored.restore(entry)
        again = restored.verdict("a", second, "k", redelivered=False, now_ms=1200, claim_id="c2")
        assert (again.action, again.reason) == ("drop", "claimed elsewhere")
    # a retry is another attempt: claimed anew
    book.add(keyed("a", 3000, 1300, mode=None, attempt=2))
    assert book.verdict("a", 3000, "k", redelivered=False, now_ms=3000, attempt=2).action == "claim"


def test_an_unrecorded_copy_waits_then_is_dropped() -> None:
    book = KeyBook()
    assert book.verdict("x", 1000, "k", redelivered=False, now_ms=1000).action == "wait"
    late = book.verdict("x", 1000, "k", redelivered=False, now_ms=1001 + UNRECORDED_GRACE_MS)
    assert (late.action, late.reason) == ("drop", "unrecorded")


def test_unkeyed_deliveries_are_handled_unless_moved() -> None:
    book = KeyBook()
    assert book.verdict("u", 1000, None, redelivered=False, now_ms=1000).action == "handle"
    book.add(JournalRecord("rescheduled", "u", "dest", 5000, cancels_due_ms=(1000,)))
    verdict = book.verdict("u", 1000, None, redelivered=False, now_ms=1000)
    assert (verdict.action, verdict.forward_due_ms) == ("forward", 5000)
    assert book.verdict("u", 5000, None, redelivered=False, now_ms=5000).action == "handle"
    book.add(
        JournalRecord("rescheduled", "u", "dest", 2000, cancels_due_ms=(5000,), fresh_copy=True)
    )
    for old in (1000, 5000):  # both older copies: the fresh copy at 2000 is the one
        assert book.verdict("u", old, None, redelivered=False, now_ms=old).action == "drop"


@dataclass
class _Race:
    """Copies of a key's messages delivered to workers that claim, read back, decide."""

    journal: list[JournalRecord]

    def read(self, upto: int) -> KeyBook:
        return KeyBook().extend(self.journal[:upto])


@settings(max_examples=200, deadline=None)
@given(
    publishes=st.lists(
        st.tuples(st.sampled_from(["ignore", "replace"]), st.integers(1, 3000)),
        min_size=1,
        max_size=8,
    ),
    deliveries=st.lists(
        st.tuples(st.integers(0, 7), st.integers(0, 2), st.integers(0, 3), st.integers(0, 2)),
        min_size=1,
        max_size=20,
    ),
)
def test_at_most_one_handled_per_generation_however_copies_race(publishes, deliveries) -> None:  # type: ignore[no-untyped-def]
    """Publishes of one key at times 0, 10, 20...; then copies of any of them reach any of
    three workers, each deciding first on a journal read up to ``lag`` records short of
    its end (other workers' claims not seen yet), then claiming and reading its claim
    back. Some copies are resends published after their time (``late`` ms: due when
    sent, the same attempt). Without a redelivery, each generation is handled at most
    once, and only by its winner."""
    race = _Race([keyed(f"m{i}", 10 * i + d, 10 * i, mode=m) for i, (m, d) in enumerate(publishes)])
    handled: dict[str, list[str]] = {}
    for n, (which, worker, lag, late) in enumerate(deliveries):
        which %= len(publishes)
        message_id, due = f"m{which}", race.journal[which].due_at_ms
        if late:
            due += 100 * late
            race.journal.append(keyed(message_id, due, due, mode=publishes[which][0]))
        book = race.read(max(len(publishes), len(race.journal) - lag))
        verdict = book.verdict(message_id, due, "k", redelivered=False, now_ms=due)
        if verdict.action == "claim":
            cid = f"c{n}"
            race.journal.append(claim(message_id, due, f"w{worker}", cid))
            book = race.read(len(race.journal))
            verdict = book.verdict(
                message_id, due, "k", redelivered=False, now_ms=due, claim_id=cid
            )
        if verdict.action == "handle":
            assert verdict.generation is not None
            handled.setdefault(verdict.generation.message_id, []).append(message_id)
    assert all(len(ids) == 1 for ids in handled.values())
    final = race.read(len(race.journal))
    for message_id in handled:
        assert not final.hides(message_id)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["ignore", "replace", "cancel", "done", "retry"]),
            st.integers(0, 3),
            st.integers(1, 500),
        ),
        max_size=30,
    ),
    cut=st.integers(0, 30),
)
def test_reading_a_stretch_twice_changes_nothing(steps, cut) -> None:  # type: ignore[no-untyped-def]
    """A reader restarting from a timestamp sees some records again: same decisions.

    Records keep the journal's causality: a cancel, ``done`` or retry names an id
    published before it (a worker writes ``done`` only after reading the id's record).
    """
    records: list[JournalRecord] = []
    published: list[tuple[str, str]] = []
    for i, (what, key, delay) in enumerate(steps):
        at = 100 * i
        if what in ("ignore", "replace"):
            records.append(keyed(f"m{i}", at + delay, at, key=f"k{key}", mode=what))
            published.append((f"m{i}", f"k{key}"))
            continue
        if not published:
            continue
        target, target_key = published[key % len(published)]
        if what == "cancel":
            records.append(JournalRecord("cancelled", target, "dest", at + delay))
        elif what == "done":
            records.append(done(target, at, key=target_key))
        else:
            records.append(keyed(target, at + delay, at, key=target_key, mode=None, attempt=2))
    once = KeyBook().extend(records)
    twice = copy.deepcopy(once).extend(records[min(cut, len(records)) :])
    assert twice == once
    pending = {k: [g for g in gens if g.pending(10**9)] for k, gens in once.generations.items()}
    assert all(len(p) <= 1 for p in pending.values())


def test_expire_forgets_old_generations_but_not_a_pending_one() -> None:
    book = KeyBook().extend(
        [keyed("a", 1000, 10), keyed("b", 2000, 20), keyed("c", 10**9, 5000, key="z")]
    )
    assert book.expire(now_ms=10**6, margin_ms=0) == 2
    assert set(book.by_id) == {"c"} and book.current("z") is not None


# ---------------------------------------------------------------------- the view


def test_scheduled_list_hides_what_will_not_be_handled() -> None:
    view = ScheduleView().extend(
        [
            keyed("a", 1000, 10),
            keyed("b", 2000, 20),  # ignored
            keyed("c", 3000, 30, key="r"),
            keyed("d", 4000, 40, key="r", mode="replace"),  # replaces c
            JournalRecord("scheduled", "plain", "dest", 5000, recorded_at_ms=50),
        ]
    )
    assert [r.message_id for r in view.pending(0)] == ["a", "d", "plain"]


def test_a_reschedule_moves_the_copies_in_the_view_and_a_cancel_names_the_old_ones() -> None:
    view = ScheduleView().extend([JournalRecord("scheduled", "u", "dest", 1000, recorded_at_ms=1)])
    plan = plan_reschedule(view, "u", 9000, now_ms=10)
    assert plan.result.outcome == "rescheduled" and plan.record is not None
    assert not plan.result.fresh_copy and plan.fresh_from is None
    view.add(plan.record)
    assert [(r.message_id, r.due_at_ms) for r in view.pending(10)] == [("u", 9000)]
    _, tombstones = plan_cancels(view, ["u"], now_ms=20)
    assert set(tombstones[0].named_due_times()) == {1000, 9000}


def test_reschedule_earlier_needs_the_body() -> None:
    view = ScheduleView().extend([JournalRecord("scheduled", "u", "dest", 9000, recorded_at_ms=1)])
    assert plan_reschedule(view, "u", 2000, now_ms=10).result.outcome == "needs body"
    with_body = ScheduleView().extend([keyed("u", 9000, 1, body=b"hi")])
    plan = plan_reschedule(with_body, "k", 2000, now_ms=10)  # by its key
    assert plan.result.outcome == "rescheduled" and plan.result.fresh_copy
    assert plan.fresh_from is not None and plan.fresh_from.body == b"hi"
    assert plan.result.message_id == "u" and plan.result.key == "k"


def test_reschedule_answers_for_what_cannot_move() -> None:
    view = ScheduleView().extend(
        [
            keyed("h", 100, 1, key="h"),
            done("h", 100, key="h"),
            keyed("c", 9000, 1, key="c"),
            JournalRecord("cancelled", "c", "dest", 9000),
            JournalRecord("scheduled", "old", "dest", 100, recorded_at_ms=1),
        ]
    )
    outcomes = {t: plan_reschedule(view, t, 50_000, now_ms=1000).result.outcome for t in "hc"}
    assert outcomes == {"h": "handled", "c": "cancelled"}
    assert plan_reschedule(view, "old", 50_000, now_ms=1000).result.outcome == "due"
    assert plan_reschedule(view, "nope", 50_000, now_ms=1000).result.outcome == "unknown"


# ---------------------------------------------------------------------- forgetting


def test_a_move_to_an_earlier_time_is_kept_until_the_old_copy_is_due() -> None:
    """Rescheduled earlier, a message's old copy still comes out at its old time: the
    book must still call it stale then, not forget the move once the new time passed
    (a worker forgetting it handled the old copy as a second message)."""
    minute = 60_000
    book = KeyBook()
    moved = JournalRecord(
        "rescheduled", "m", "dest", 5 * minute, cancels_due_ms=(60 * minute,), fresh_copy=True
    )
    book.add(moved)
    book.expire(20 * minute, margin_ms=minute)  # the new time and its margin are past
    verdict = book.verdict("m", 60 * minute, None, redelivered=False, now_ms=60 * minute)
    assert (verdict.action, verdict.reason) == ("drop", "rescheduled")
    book.expire(62 * minute, margin_ms=minute)  # the old copy's time too: forgotten
    assert book.moves == {}


def test_a_retry_of_a_forgotten_generation_is_handled_not_lost_to_the_next() -> None:
    """A keyed message handled late (a stuck tier, a long handler) and retried after the
    reader forgot its generation, while a newer generation of the key is pending: the
    retry carries the key but no ``ignore``/``replace`` (a first publish always does),
    so it goes on as its own message; it neither loses to the newer one nor takes the
    key from it."""
    minute = 60_000
    book = KeyBook()
    book.add(keyed("old", 10 * minute, 0))
    book.expire(25 * minute, margin_ms=minute)  # settled and forgotten
    book.add(keyed("new", 60 * minute, 20 * minute, mode="replace"))
    book.add(keyed("old", 31 * minute, 30 * minute, mode=None, attempt=2))
    verdict = book.verdict("old", 31 * minute, "k", redelivered=False, now_ms=31 * minute)
    assert verdict.action == "claim"
    current = book.current("k")
    assert current is not None and current.message_id == "new"
    assert book.pending("k", 40 * minute) is current
    assert book.outcome("new")[0] == "scheduled"
    # a later first publish still finds the newer one pending
    book.add(keyed("third", 90 * minute, 41 * minute, mode="ignore"))
    assert book.outcome("third")[0] == "ignored"


def test_a_generation_is_kept_while_a_later_copy_of_it_may_come() -> None:
    """A record written late can set a generation's due time back to an earlier copy's;
    the generation stays until its latest copy (a retry) is due and settled."""
    minute = 60_000
    book = KeyBook()
    book.add(keyed("m", 10 * minute, 0))
    book.add(keyed("m", 40 * minute, 11 * minute, mode=None, attempt=2))  # the retry
    book.add(keyed("m", 10 * minute, 0))  # the first record, written again late
    book.expire(20 * minute, margin_ms=minute)
    assert "m" in book.by_id
    verdict = book.verdict("m", 40 * minute, "k", redelivered=False, now_ms=40 * minute)
    assert verdict.action == "claim"


def test_the_view_keeps_what_the_key_book_knows_of_an_id_a_tombstone_still_names() -> None:
    """A replaced (or ignored) id whose later copy a tombstone names: the view keeps the
    tombstone past the id's settled generation, so the journal may speak of that copy
    again; the key book must still know the id then, or the copy recorded again would
    start a new generation and be handled (tests/unit/test_checkpoint.py's examples)."""
    minute = 60_000
    view = ScheduleView().extend(
        [
            keyed("old", 10 * minute, 0, mode=None),
            JournalRecord("cancelled", "old", "dest", 11 * minute, recorded_at_ms=minute),
            keyed("new", 10 * minute, 2 * minute, mode="replace"),
            keyed("late", 10 * minute, 3 * minute),  # lost to new
            JournalRecord("cancelled", "late", "dest", 11 * minute, recorded_at_ms=4 * minute),
        ]
    )
    view.expire(21 * minute, margin_ms=10 * minute)  # every copy settled, the tombstones not
    assert set(view.cancelled) == {"old", "late"}
    statuses = {i: view.keys.status(i, 21 * minute) for i in ("old", "late")}
    assert statuses == {"old": "replaced", "late": "ignored"}
    view.add(keyed("old", 21 * minute, 16 * minute, mode=None, attempt=2))
    view.add(keyed("late", 21 * minute, 16 * minute, mode=None, attempt=2))
    for message_id, reason in (("old", "replaced"), ("late", "ignored")):
        verdict = view.keys.verdict(
            message_id, 21 * minute, "k", redelivered=False, now_ms=21 * minute
        )
        assert (verdict.action, verdict.reason) == ("drop", reason)
    assert view.pending(16 * minute) == []
    view.expire(32 * minute, margin_ms=10 * minute)  # the tombstones and copies settled
    assert view.cancelled == {} and view.keys.by_id == {} and view.keys.generations == {}
