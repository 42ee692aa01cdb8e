"""Recurring schedules on a broker: add, list, pause, resume, remove, and the chain a
worker carries forward (the SIGKILL test is tests/broker/test_recurring_kill.py)."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from rmqdelay import AsyncPublisher, Publisher, RecurringError
from rmqdelay.core.clock import now_ms
from rmqdelay.core.journal.keys import recurring_key
from rmqdelay.core.journal.rules import CHAIN, OCCURRENCE, RECURRING, STATE, read_occurrence
from rmqdelay.worker.context import Context
from tests.helpers.worker_helpers import TestTopology, wait_until

pytestmark = pytest.mark.broker


def test_add_list_pause_resume_remove(shared_topology: TestTopology) -> None:
    dest = shared_topology.dest("recur")
    name = shared_topology.dest("every-hour")
    settings = shared_topology.settings([dest])
    with Publisher(settings) as publisher:
        added = publisher.add_recurring(name, dest, {"job": "poll"}, every="1h", headers={"a": "1"})
        assert added.outcome == "added" and added.rule == "every 1h"
        assert added.next_ms is not None and added.next_ms % 3_600_000 == 0
        assert now_ms() < added.next_ms <= now_ms() + 3_600_000
        # the first occurrence: keyed, its chain in its headers, the user's beside them
        pending = [
            r for r in publisher.list_scheduled(destination=dest) if r.headers.get(RECURRING)
        ]
        assert [r.due_at_ms for r in pending] == [added.next_ms]
        (first,) = pending
        assert first.key == recurring_key(name, added.next_ms)
        assert first.message_id == added.message_id
        assert first.headers["a"] == "1"
        occurrence = read_occurrence(first.headers)
        assert occurrence is not None
        assert (occurrence.name, occurrence.at_ms, occurrence.state) == (
            name,
            added.next_ms,
            "active",
        )
        assert first.headers[OCCURRENCE] == added.next_ms and first.headers[CHAIN]

        again = publisher.add_recurring(name, dest, {"job": "poll"}, every="1h")
        assert (again.outcome, again.next_ms, again.message_id) == (
            "exists",
            added.next_ms,
            added.message_id,
        )
        with pytest.raises(RecurringError, match="remove it first"):
            publisher.add_recurring(name, dest, b"x", cron="*/30 * * * *", tz="Europe/Berlin")

        (listed,) = [s for s in publisher.list_recurring() if s.name == name]
        assert (listed.state, listed.destination, listed.next_occurrence(now_ms())) == (
            "active",
            dest,
            added.next_ms,
        )
        assert publisher.pause_recurring(name).outcome == "paused"
        (listed,) = [s for s in publisher.list_recurring() if s.name == name]
        assert listed.state == "paused"
        assert publisher.resume_recurring(name).outcome == "resumed"
        (listed,) = [s for s in publisher.list_recurring() if s.name == name]
        assert listed.state == "active"

        removed = publisher.remove_recurring(name)
        assert removed.outcome == "removed" and removed.cancelled == (added.message_id,)
        assert name not in [s.name for s in publisher.list_recurring()]
        assert not [
            r for r in publisher.list_scheduled(destination=dest) if r.headers.get(RECURRING)
        ]
        assert publisher.pause_recurring(name).outcome == "unknown"
        # a second remove answers as the first did, as a second cancel does
        again = publisher.remove_recurring(name)
        assert (again.outcome, again.cancelled) == ("removed", ())

        # a new chain of the same name after a remove
        readded = publisher.add_recurring(name, dest, b"x", cron="*/30 * * * *", tz="Europe/Berlin")
        assert readded.outcome == "added" and readded.message_id != added.message_id
        assert publisher.remove_recurring(name).outcome == "removed"
    assert STATE  # the header names are public


def test_add_refuses_what_cannot_work(shared_topology: TestTopology) -> None:
    dest = shared_topology.dest("recur-bad")
    settings = shared_topology.settings([dest], max_delay="1h")
    with Publisher(settings) as publisher:
        with pytest.raises(RecurringError, match="longest delay"):
            publisher.add_recurring("daily", dest, b"x", cron="0 9 * * *")
        with pytest.raises(RecurringError, match="name"):
            publisher.add_recurring("no spaces", dest, b"x", every="1m")
        # nothing was recorded: the name is free
        assert "daily" not in [s.name for s in publisher.list_recurring()]


async def test_a_worker_carries_the_chain_pause_resume_remove(
    shared_topology: TestTopology,
) -> None:
    """every 1s: each occurrence handled once, in order, at or after its time; paused
    occurrences are acked unhandled and the chain goes on; remove ends it."""
    case = shared_topology.worker("recur-w")
    dest, settings, app, calls = case
    name = shared_topology.dest("tick")

    @app.handler(dest)
    async def handle(msg: dict[str, str], ctx: Context) -> None:
        calls.record(msg, ctx)

    def occurrences() -> list[int]:
        return [int(c.headers[OCCURRENCE]) for c in calls.items]

    async with case.running(concurrency=2), AsyncPublisher(settings) as publisher:
        added = await publisher.add_recurring(name, dest, {"tick": "x"}, every="1s")
        assert added.next_ms is not None
        await wait_until(lambda: len(calls) >= 3, 20, "three occurrences handled")
        assert (await publisher.pause_recurring(name)).outcome == "paused"
        paused_at = now_ms()
        handled_before_pause = len(calls)
        await asyncio.sleep(2.5)
        during = [at for at in occurrences()[handled_before_pause:] if at > paused_at + 1000]
        assert during == []  # at most the one already admitted when the pause was written
        # the chain goes on while paused: an occurrence past the pause is published (each
        # is published as the one before it is admitted, so a loaded worker shows it late)
        deadline = time.monotonic() + 20
        while True:
            paused = {s.name: s for s in await publisher.list_recurring()}[name]
            assert paused.state == "paused"
            if max(paused.occurrences) > paused_at + 1000:
                break
            assert time.monotonic() < deadline, f"the chain stopped at {max(paused.occurrences)}"
            await asyncio.sleep(0.2)
        assert (await publisher.resume_recurring(name)).outcome == "resumed"
        resumed = len(calls)
        await wait_until(lambda: len(calls) >= resumed + 2, 20, "handled again after resume")
        removed = await publisher.remove_recurring(name)
        assert removed.outcome == "removed"
        ended = len(calls)
        await asyncio.sleep(2.5)
        assert len(calls) <= ended + 1  # one may have been admitted as the remove went out
    seen = occurrences()
    assert seen == sorted(set(seen))  # each once, in order
    assert seen[0] == added.next_ms
    assert all(b - a >= 1000 and (b - a) % 1000 == 0 for a, b in itertools.pairwise(seen))
    for call in calls.items:
        assert call.at * 1000 >= int(call.headers[OCCURRENCE])  # never early
        assert call.value == {"tick": "x"}


def test_the_command_line(shared_topology: TestTopology) -> None:
    """add, list, pause, resume, remove and status --recurring as a user types them."""
    import json

    from tests.helpers.cli import invoke, settings_env

    dest = shared_topology.dest("recur-cli")
    name = shared_topology.dest("nightly")
    settings = shared_topology.settings([dest])
    env = settings_env(settings)

    def cli(*args: str) -> tuple[int, str]:
        result = invoke(env, *args)
        return result.exit_code, result.output

    code, said = cli(
        "recurring", "add", name, dest, '{"n": 1}', "--content-type", "json",
        "--cron", "*/30 * * * *", "--tz", "Europe/Berlin", "--json",
    )  # fmt: skip
    assert code == 0, said
    added = json.loads(said)
    assert (added["outcome"], added["rule"]) == ("added", "cron */30 * * * * (Europe/Berlin)")
    # the old spelling (NAME BODY -d DEST), kept for a release: the same schedule
    code, said = cli("recurring", "add", name, "x", "-d", dest, "--cron", "*/30 * * * *",
                     "--tz", "Europe/Berlin")  # fmt: skip
    assert code == 0 and f"{name}: exists" in said, said
    assert "--destination is deprecated, use the DESTINATION argument" in said
    code, said = cli("recurring", "list", "--json")
    rows = [json.loads(line) for line in said.splitlines()]
    (row,) = [r for r in rows if r["name"] == name]
    assert (row["state"], row["next_ms"]) == ("active", added["next_ms"])
    assert cli("recurring", "pause", name)[0] == 0
    code, said = cli("recurring", "list")
    assert code == 0 and name in said and "paused" in said, said
    code, said = cli("status", "--recurring", "--json", "-d", dest)
    assert code == 0, said
    assert json.loads(said)["recurring"]["paused"] >= 1
    assert cli("recurring", "resume", name)[0] == 0
    code, said = cli("recurring", "remove", name)
    assert code == 0 and "cancelled the pending occurrence" in said, said
    code, said = cli("recurring", "remove", name)
    assert code == 0 and said.startswith(f"{name}: removed (cron */30"), said
    assert "cancelled the pending occurrence" not in said, said
    code, said = cli("recurring", "pause", name)
    assert code == 1 and f"{name}: unknown" in said, said
    code, said = cli("recurring", "add", name, dest, "x", "--cron", "99 * * * *")
    assert code == 2 and "5 fields" in said, said


async def test_a_failing_occurrence_is_retried_and_parked_and_the_chain_goes_on(
    shared_topology: TestTopology,
) -> None:
    from rmqdelay import Backoff
    from tests.helpers.worker_helpers import parking_queue, queue_depth

    case = shared_topology.worker("recur-fail")
    dest, settings, app, calls = case
    name = shared_topology.dest("flaky")
    failing: set[int] = set()
    known = asyncio.Event()  # the chain's first occurrence, from add_recurring's answer

    @app.handler(dest, max_attempts=2, backoff=Backoff.constant("300ms"))
    async def handle(msg: object, ctx: Context) -> None:
        calls.record(msg, ctx)
        at = int(ctx.headers[OCCURRENCE])
        # the first occurrence fails, every attempt; it may be due before add_recurring
        # answers, and on a loaded machine come after the second (concurrency 2)
        await known.wait()
        if at in failing:
            raise RuntimeError("this one fails")

    def of(failed: bool) -> list[int]:
        return [
            int(c.headers[OCCURRENCE])
            for c in calls.items
            if (int(c.headers[OCCURRENCE]) in failing) == failed
        ]

    async with case.running(concurrency=2), AsyncPublisher(settings) as publisher:
        added = await publisher.add_recurring(name, dest, b"x", every="1s")
        assert added.next_ms is not None
        failing.add(added.next_ms)
        known.set()
        await wait_until(lambda: len(of(False)) >= 3, 20, "three occurrences after the failing one")
        await wait_until(lambda: len(of(True)) >= 2, 20, "the failing occurrence's two attempts")
        assert (await publisher.remove_recurring(name)).outcome == "removed"
        await asyncio.sleep(0.5)
    attempts = [c.attempt for c in calls.items if int(c.headers[OCCURRENCE]) == added.next_ms]
    assert attempts == [1, 2]
    ok = sorted(int(c.headers[OCCURRENCE]) for c in calls.items if c.attempt == 1)
    assert ok[:4] == [added.next_ms + 1000 * i for i in range(4)]  # the chain went on
    assert await queue_depth(settings, parking_queue(settings)) == 1
