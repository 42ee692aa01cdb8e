"""The status snapshot, built from counts and rendered, and the watch over past-time
messages, without a broker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from rmqdelay import Settings
from rmqdelay.core.status import (
    PastDueWatch,
    QueueCounts,
    Status,
    StuckTier,
    build_status,
    prometheus_text,
    stuck_tiers,
    watch_past_due,
)


def test_a_snapshot_sums_tiers_and_names_what_is_missing() -> None:
    layout = Settings(prefix="shop", max_delay="10m").layout
    first, second, *_ = layout.tiers
    counts = {
        first.queue: QueueCounts(3),
        second.queue: QueueCounts(4),
        layout.work_queue("orders"): QueueCounts(7, ready=5, unacked=2, consumers=1),
        layout.parking: QueueCounts(1),
    }
    status = build_status(layout, counts, ["orders", "gone"], "test")
    assert status.scheduled == 7
    assert status.parked == 1
    assert [(d.destination, d.ready, d.unacked) for d in status.destinations] == [
        ("orders", 5, 2),
        ("gone", None, None),
    ]
    assert layout.work_queue("gone") in status.missing
    assert "shop.schedule" in status.missing  # the journal is on by default
    assert status.to_json()["scheduled"] == 7


def test_the_prometheus_text_parses_into_the_three_gauges() -> None:
    layout = Settings(prefix="shop", max_delay="10m").layout
    tier = layout.tiers[0]
    counts = {
        tier.queue: QueueCounts(3),
        layout.work_queue("orders"): QueueCounts(2, ready=2, unacked=0),
        layout.parking: QueueCounts(4),
    }
    text = prometheus_text(build_status(layout, counts, ["orders"], "test"))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    tier_labels = (("prefix", "shop"), ("tier", tier.queue), ("ttl_ms", str(tier.ttl_ms)))
    assert samples[("rmqdelay_scheduled_messages", tier_labels)] == 3
    assert samples[("rmqdelay_parked_messages", (("prefix", "shop"),))] == 4
    ready = (("destination", "orders"), ("prefix", "shop"), ("state", "ready"))
    assert samples[("rmqdelay_work_queue_messages", ready)] == 2


def test_the_latest_checkpoint_is_said_and_its_time_is_a_gauge() -> None:
    from rmqdelay.core.journal.checkpoint import GENESIS, Pointer

    layout = Settings(prefix="shop", max_delay="10m").layout
    counts = {"shop.schedule": QueueCounts(None)}
    pointer = Pointer("c1", 1_800_000_000_000, 42, 7, {"copies": (3, 1200, 300_000)})
    status = build_status(layout, counts, [], "test", checkpoint=pointer)
    assert status.journal is not None
    assert (status.journal.checkpoint_at_ms, status.journal.checkpoint_copies) == (
        1_800_000_000_000,
        1200,
    )
    assert status.journal.checkpoint_bytes == 300_000
    assert status.to_json()["journal"]["checkpoint_copies"] == 1200
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(prometheus_text(status))
        for s in family.samples
    }
    assert samples["rmqdelay_journal_checkpoint_timestamp_seconds"] == 1_800_000_000
    # none yet: no gauge (an absent series, not a zero that would read as 1970)
    empty = build_status(layout, counts, [], "test", checkpoint=GENESIS)
    assert empty.journal is not None and empty.journal.checkpoint_at_ms is None
    assert "checkpoint_timestamp" not in prometheus_text(empty)


# --------------------------------------------------------------------------- past-time messages


def _tiers_status(*past_due: int | None) -> tuple[Status, list[str]]:
    """A snapshot whose first tiers hold these past-time counts (the rest: 0)."""
    layout = Settings(prefix="shop", max_delay="10m").layout
    names = [t.queue for t in layout.tiers]
    counts = {name: QueueCounts(1, ready=1, unacked=0, past_due=0) for name in names}
    for name, n in zip(names, past_due, strict=False):
        counts[name] = QueueCounts(1, ready=1, unacked=0, past_due=n)
    return build_status(layout, counts, [], "test"), names


def test_past_time_counts_are_summed_and_unknown_is_never_zero() -> None:
    status, _ = _tiers_status(5, 2)
    assert status.past_due == 7
    assert status.to_json()["past_due"] == 7
    assert [t.past_due for t in status.tiers[:3]] == [5, 2, 0]
    # one snapshot tells no age
    assert all(t.past_due_for_s is None for t in status.tiers)
    unknown, _ = _tiers_status(5, None)
    assert unknown.past_due is None
    assert unknown.to_json()["past_due"] is None
    # over AMQP (QueueCounts without past_due) every tier is unknown
    layout = Settings(prefix="shop", max_delay="10m").layout
    amqp = build_status(layout, {t.queue: QueueCounts(0) for t in layout.tiers}, [], "AMQP")
    assert amqp.past_due is None
    assert all(t.past_due is None for t in amqp.tiers)


def test_the_watch_times_each_tier_from_the_first_snapshot_that_found_some() -> None:
    watch = PastDueWatch()
    first = watch.observe(_tiers_status(5, 0, 1)[0], now=100.0)
    assert [t.past_due_for_s for t in first.tiers[:3]] == [0.0, 0.0, 0.0]
    later = watch.observe(_tiers_status(3, 2, None)[0], now=104.5)
    # tier 0 held some in both; tier 1 only now; tier 2 cannot tell: no age
    assert [t.past_due_for_s for t in later.tiers[:3]] == [4.5, 0.0, None]
    drained = watch.observe(_tiers_status(0, 2, 1)[0], now=110.0)
    assert [t.past_due_for_s for t in drained.tiers[:3]] == [0.0, 5.5, 0.0]
    again = watch.observe(_tiers_status(1, 2, 1)[0], now=111.0)
    # tier 0 drained in between: its clock starts over; tier 2's unknown broke its run
    assert [t.past_due_for_s for t in again.tiers[:3]] == [0.0, 6.5, 1.0]
    assert [s.queue for s in stuck_tiers(again, 6.0)] == [again.tiers[1].queue]
    [stuck] = stuck_tiers(again, 6.5)
    assert (stuck.past_due, stuck.for_s) == (2, 6.5)
    assert stuck.describe() == (
        f"tier {stuck.queue} holds 2 message(s) past their time, for at least 6 s"
    )
    assert stuck_tiers(again, 7.0) == []


@given(st.lists(st.tuples(st.sampled_from([None, 0, 1, 3]), st.floats(0, 10)), max_size=30))
def test_the_watched_age_is_the_time_since_the_run_of_snapshots_with_some_began(
    samples: list[tuple[int | None, float]],
) -> None:
    watch, now, run_start = PastDueWatch(), 0.0, None
    for past_due, step in samples:
        now += step
        tier = watch.observe(_tiers_status(past_due)[0], now).tiers[0]
        if past_due:
            run_start = now if run_start is None else run_start
            assert tier.past_due_for_s == now - run_start
        else:
            run_start = None
            assert tier.past_due_for_s == (None if past_due is None else 0.0)


class _Broker:
    """Snapshots from a script of past-time counts for the first tier, on a fake clock."""

    def __init__(self, script: list[int | None]) -> None:
        self.script, self.now, self.taken = script, 0.0, 0

    def snapshot(self) -> Status:
        value = self.script[min(self.taken, len(self.script) - 1)]
        self.taken += 1
        return _tiers_status(value)[0]

    def watch(self, after: float) -> tuple[Status, list[StuckTier]]:
        def sleep(seconds: float) -> None:
            self.now += seconds

        return watch_past_due(
            self.snapshot, after, interval_s=1.0, clock=lambda: self.now, sleep=sleep
        )


def test_the_check_takes_one_snapshot_when_nothing_is_past_its_time() -> None:
    broker = _Broker([0])
    status, stuck = broker.watch(60.0)
    assert (stuck, broker.taken, broker.now) == ([], 1, 0.0)
    assert status.tiers[0].past_due_for_s == 0.0


def test_the_check_waits_for_a_drain_and_names_a_tier_that_never_drains() -> None:
    drains = _Broker([4, 4, 3, 0])
    status, stuck = drains.watch(60.0)
    assert (stuck, drains.taken, drains.now) == ([], 4, 3.0)
    never = _Broker([4])
    status, stuck = never.watch(2.0)
    assert [(s.queue, s.past_due, s.for_s) for s in stuck] == [(status.tiers[0].queue, 4, 2.0)]
    assert never.taken == 3  # at 0, 1 and 2 s
    # unknown is not stuck: the caller says it cannot tell
    status, stuck = _Broker([None]).watch(2.0)
    assert stuck == [] and status.tiers[0].past_due is None


def test_the_prometheus_text_has_past_time_gauges_only_where_known() -> None:
    status, names = _tiers_status(5, None)
    families = {f.name: f for f in text_string_to_metric_families(prometheus_text(status))}
    counted = {s.labels["tier"]: s.value for s in families["rmqdelay_past_due_messages"].samples}
    assert counted[names[0]] == 5
    assert names[1] not in counted  # unknown: absent, not 0
    assert counted[names[2]] == 0
    assert "rmqdelay_past_due_seconds" not in families  # one snapshot: no age
    watched = PastDueWatch()
    watched.observe(status, 10.0)
    text = prometheus_text(watched.observe(status, 12.25))
    ages = {
        s.labels["tier"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "rmqdelay_past_due_seconds"
        for s in f.samples
    }
    assert ages[names[0]] == 2.25
    assert names[1] not in ages
    assert ages[names[2]] == 0


def test_a_quorum_tier_from_the_api_counts_its_dlx_messages_apart() -> None:
    from rmqdelay.amqp.status import _queue_counts

    # as RabbitMQ 3.10.8's API showed a tier whose next queue refused its messages
    stuck = {"name": "t", "type": "quorum", "messages": 5, "messages_ready": 0}
    stuck |= {"messages_unacknowledged": 0, "messages_dlx": 5, "consumers": 0}
    assert _queue_counts(stuck) == QueueCounts(0, ready=0, unacked=0, consumers=0, past_due=5)
    # the first seconds after a declare the API has no statistics: unknown, not 0
    fresh = _queue_counts({"name": "t", "type": "quorum"})
    assert fresh.past_due is None
    classic = _queue_counts({"name": "t", "type": "classic", "messages": 2, "messages_ready": 2})
    assert (classic.messages, classic.past_due) == (2, None)
