"""Recurring schedules on a broker: add, list, pause, resume, remove, and the chain a
worker carries forward (the SIGKILL test is tests/broker/test_recurring_kill.py)."""

from __future__ import annotations

import pytest

from rmqdelay import Publisher, RecurringError
from rmqdelay.core.clock import now_ms
from rmqdelay.core.keys import recurring_key
from rmqdelay.core.recurring import CHAIN, OCCURRENCE, RECURRING, STATE, read_occurrence
from tests.helpers.worker_helpers import TestTopology

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
        assert publisher.remove_recurring(name).outcome == "unknown"

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
