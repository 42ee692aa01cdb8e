"""The keys filter without a broker: what it admits for each verdict, with a journal
writer that hands each record straight back to the filter (its tail's read-back)."""

from __future__ import annotations

import asyncio
from typing import Any

from rmqdelay import Settings
from rmqdelay.core.clock import now_ms
from rmqdelay.core.journal.records import JournalRecord
from rmqdelay.core.messages import KEY
from rmqdelay.worker import Admission, Delivery
from rmqdelay.worker.cancel import CancelFilter
from rmqdelay.worker.keys import KeyFilter

SETTINGS = Settings(prefix="keys-unit")
LAYOUT = SETTINGS.layout


class ReadBack:
    """A writer whose records the tail reads back at once (or never, ``silent``)."""

    def __init__(self, keys: KeyFilter, silent: bool = False) -> None:
        self.keys, self.silent = keys, silent
        self.written: list[JournalRecord] = []

    async def write(self, records: list[JournalRecord]) -> None:
        self.written += records
        if not self.silent:
            for record in records:
                self.keys.add(record)


def _filter(silent: bool = False, timeout: float = 2.0) -> tuple[KeyFilter, ReadBack]:
    cancels = CancelFilter(SETTINGS.replace(confirm_timeout=timeout))
    keys = KeyFilter(LAYOUT, timeout, cancels)
    writer = ReadBack(keys, silent)
    keys._writer = writer  # type: ignore[assignment]
    cancels.reach_ms = now_ms() - 1000  # connected 1 s ago, no checkpoint: all before is
    return keys, writer


def _scheduled(message_id: str, due: int, key: str, mode: str | None = "ignore") -> JournalRecord:
    return JournalRecord(
        "scheduled",
        message_id,
        "jobs",
        due,
        recorded_at_ms=due - 1000,
        key=key,
        on_conflict=mode,  # type: ignore[arg-type]
    )


def _delivery(message_id: str, due: int, key: str | None, redelivered: bool = False) -> Delivery:
    headers: dict[str, Any] = {} if key is None else {KEY: key}
    return Delivery("jobs", message_id, 1, due, now_ms(), headers, redelivered)


def _admit(keys: KeyFilter, delivery: Delivery) -> Admission | None:
    pending = keys.admit(delivery, None, None)  # type: ignore[arg-type]
    if pending is None:
        return None

    async def wait() -> Admission:
        assert pending is not None
        return await pending

    return asyncio.run(wait())


def test_an_unkeyed_delivery_is_not_asked_about() -> None:
    keys, _ = _filter()
    assert keys.admit(_delivery("m", now_ms(), None), None, None) is None  # type: ignore[arg-type]


def test_the_first_claim_is_handled_its_done_written_and_other_copies_dropped() -> None:
    keys, writer = _filter()
    due = now_ms()
    keys.add(_scheduled("a", due, "k"))
    keys.add(_scheduled("b", due + 5, "k"))  # ignored: a is pending
    first = _admit(keys, _delivery("a", due, "k"))
    assert first is not None and first.action == "handle"
    assert [(r.kind, r.claim_id != "") for r in writer.written] == [("claimed", True)]
    (done,) = first.on_success
    asyncio.run(done())  # type: ignore[arg-type]
    assert [r.kind for r in writer.written] == ["claimed", "done"]
    assert _admit(keys, _delivery("a", due, "k")) == Admission("drop", "duplicate")
    assert _admit(keys, _delivery("b", due + 5, "k")) == Admission("drop", "ignored")


def test_a_copy_claimed_elsewhere_is_dropped_unless_redelivered() -> None:
    keys, _ = _filter()
    due = now_ms()
    keys.add(_scheduled("a", due, "k"))
    keys.add(JournalRecord("claimed", "a", "jobs", due, key="k", worker="other", claim_id="c1"))
    assert _admit(keys, _delivery("a", due, "k")) == Admission("drop", "claimed elsewhere")
    taken = _admit(keys, _delivery("a", due, "k", redelivered=True))
    assert taken is not None and (taken.action, taken.reason) == ("handle", "taken over")


def test_a_redelivered_copy_waits_while_this_worker_handles_the_claim() -> None:
    # copy B (fresh) claims and its handler runs; copy A (redelivered, a duplicate publish
    # of the same generation) arrives meanwhile: it waits, and is dropped once B's done
    # is read back, instead of taking the claim over and running the handler twice
    keys, writer = _filter()
    due = now_ms()
    keys.add(_scheduled("a", due, "k"))

    async def both() -> tuple[Admission, Admission]:
        handler_runs = asyncio.Event()
        finish = asyncio.Event()

        async def copy_b() -> Admission:
            admitted = await keys._keyed(_delivery("a", due, "k"), "k")
            handler_runs.set()
            await finish.wait()  # the handler runs
            for step in admitted.on_success:
                await step()
            return admitted

        b = asyncio.create_task(copy_b())
        await handler_runs.wait()
        a = asyncio.create_task(keys._keyed(_delivery("a", due, "k", redelivered=True), "k"))
        await asyncio.sleep(0.7)  # more than one of the waiting copy's polls
        assert not a.done()
        finish.set()
        return await b, await a

    b, a = asyncio.run(both())
    assert (b.action, b.reason) == ("handle", "")
    assert a == Admission("drop", "duplicate")
    assert [r.kind for r in writer.written] == ["claimed", "done"]
    assert keys._here == {}  # released once its done was read back: nothing kept per message


def test_a_redelivered_copy_takes_over_once_the_handling_here_failed() -> None:
    keys, writer = _filter()
    due = now_ms()
    keys.add(_scheduled("a", due, "k"))

    async def fail_then_redeliver() -> Admission:
        # the handling task ends without its done record (the handler raised)
        await asyncio.create_task(keys._keyed(_delivery("a", due, "k"), "k"))
        return await keys._keyed(_delivery("a", due, "k", redelivered=True), "k")

    taken = asyncio.run(fail_then_redeliver())
    assert (taken.action, taken.reason) == ("handle", "taken over")
    assert [r.kind for r in writer.written] == ["claimed"]
    assert keys._here == {}  # the handling that took it over ended too


def test_a_claim_not_read_back_in_time_gives_the_message_back() -> None:
    keys, _ = _filter(silent=True, timeout=0.2)
    due = now_ms()
    keys.add(_scheduled("a", due, "k"))
    assert _admit(keys, _delivery("a", due, "k")) == Admission("requeue", "claim not read back")
    assert keys._claims == {}


def test_a_delivery_waits_for_its_record_and_then_claims() -> None:
    keys, _ = _filter()
    due = now_ms()

    async def run() -> Admission:
        pending = keys.admit(_delivery("late", due, "k"), None, None)  # type: ignore[arg-type]
        assert pending is not None
        task = asyncio.ensure_future(pending)
        await asyncio.sleep(0.05)
        assert not task.done()
        keys.add(_scheduled("late", due, "k"))
        return await asyncio.wait_for(task, 2)

    assert asyncio.run(run()).action == "handle"


def test_a_keyed_copy_older_than_what_was_read_is_handled() -> None:
    keys, writer = _filter()
    old = now_ms() - 60_000  # due before the worker read the journal, and unknown to it
    admitted = _admit(keys, _delivery("ancient", old, "k"))
    assert admitted == Admission("handle", "record out of reach")
    assert writer.written == []


def test_an_old_copy_of_a_moved_message_is_forwarded_or_dropped() -> None:
    keys, _ = _filter()
    due = now_ms()
    keys.add(JournalRecord("rescheduled", "m", "jobs", due + 5000, cancels_due_ms=(due,)))
    keys.add(
        JournalRecord(
            "rescheduled", "n", "jobs", due - 5000, cancels_due_ms=(due,), fresh_copy=True
        )
    )
    assert _admit(keys, _delivery("m", due, None)) == Admission(
        "forward", "rescheduled", forward_due_ms=due + 5000
    )
    assert _admit(keys, _delivery("m", due + 5000, None)) is None  # the new copy
    assert _admit(keys, _delivery("n", due, None)) == Admission("drop", "rescheduled")


def test_the_keys_pending_gauge_counts_keys_a_pending_message_holds() -> None:
    from prometheus_client import REGISTRY

    keys, _ = _filter()
    now = now_ms()
    keys.add(_scheduled("a", now + 60_000, "held"))
    keys.add(_scheduled("b", now + 60_000, "held"))  # ignored: the key counts once
    keys.add(_scheduled("c", now - 1_000, "due"))  # due already: holds nothing
    assert REGISTRY.get_sample_value("rmqdelay_keys_pending") == 1
    keys.add(JournalRecord("cancelled", "a", "d", now + 60_000))
    assert REGISTRY.get_sample_value("rmqdelay_keys_pending") == 0
