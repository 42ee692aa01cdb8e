"""Worker hooks without a broker: the order they run in, a hook that fails, and the
worker's own hooks (cancel filter, metrics, logs) on deliveries made by hand."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import REGISTRY

from rmqdelay import ConfigurationError, Settings
from rmqdelay.core.journal.records import JournalRecord
from rmqdelay.worker import Delivery, Settled, Worker, WorkerHook
from rmqdelay.worker.cancel import CancelFilter
from rmqdelay.worker.hooks import Hooks
from rmqdelay.worker.logs import LogHook
from rmqdelay.worker.metrics import MetricsHook

NOW_MS = 1_800_000_000_000


def _delivery(message_id: str = "m-1", due_ms: int | None = NOW_MS - 250) -> Delivery:
    return Delivery("jobs", message_id, 2, due_ms, NOW_MS, {"tenant": "acme"}, False)


class Recorder(WorkerHook):
    def __init__(self, name: str, calls: list[tuple[str, ...]], skip: bool = False) -> None:
        self.name, self.calls, self.skips = name, calls, skip

    async def on_connect(self, connection: object, lost: asyncio.Event) -> None:
        self.calls.append((self.name, "connect"))

    async def on_disconnect(self) -> None:
        self.calls.append((self.name, "disconnect"))

    def before_handle(self, delivery: Delivery) -> bool:
        self.calls.append((self.name, "before", delivery.message_id))
        return self.skips

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        self.calls.append((self.name, "after", delivery.message_id, settled.outcome))


class Broken(WorkerHook):
    def __init__(self, calls: list[tuple[str, ...]]) -> None:
        self.calls = calls

    async def on_disconnect(self) -> None:
        raise RuntimeError("disconnect hook bug")

    def before_handle(self, delivery: Delivery) -> bool:
        self.calls.append(("broken", "before", delivery.message_id))
        raise RuntimeError("before hook bug")

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        self.calls.append(("broken", "after", delivery.message_id, settled.outcome))
        raise RuntimeError("after hook bug")


class OnlyAfter(WorkerHook):
    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        pass


def test_hooks_run_in_order_and_a_skip_stops_the_asking() -> None:
    calls: list[tuple[str, ...]] = []
    hooks = Hooks([Recorder("a", calls), Recorder("b", calls, skip=True), Recorder("c", calls)])

    async def session() -> bool:
        await hooks.connect(object(), asyncio.Event())  # type: ignore[arg-type]
        skipped = hooks.skip(_delivery())
        hooks.settled(_delivery(), Settled("cancelled"))
        await hooks.disconnect()
        return skipped

    assert asyncio.run(session()) is True
    assert calls == [
        ("a", "connect"),
        ("b", "connect"),
        ("c", "connect"),
        ("a", "before", "m-1"),
        ("b", "before", "m-1"),  # b skips: c is not asked
        ("a", "after", "m-1", "cancelled"),
        ("b", "after", "m-1", "cancelled"),
        ("c", "after", "m-1", "cancelled"),
        ("a", "disconnect"),
        ("b", "disconnect"),
        ("c", "disconnect"),
    ]


def test_a_method_left_alone_is_never_called() -> None:
    only_after = OnlyAfter()
    hooks = Hooks([only_after])
    assert hooks._before == hooks._connect == hooks._disconnect == ()
    assert hooks._after == (only_after,)


def test_a_failing_hook_skips_nothing_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """At least once: a filter that fails lets the message be handled; a hook that fails
    after settling changes nothing about the settling (done once, before the hooks)."""
    calls: list[tuple[str, ...]] = []
    hooks = Hooks([Broken(calls), Recorder("r", calls)])
    caplog.set_level(logging.ERROR, logger="rmqdelay.worker")
    assert hooks.skip(_delivery()) is False
    hooks.settled(_delivery(), Settled("acked", seconds=0.01))
    asyncio.run(hooks.disconnect())
    assert calls == [
        ("broken", "before", "m-1"),
        ("r", "before", "m-1"),
        ("broken", "after", "m-1", "acked"),
        ("r", "after", "m-1", "acked"),
        ("r", "disconnect"),
    ]
    said = [(r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert said == [
        ("hook Broken failed in before_handle; the message is handled", True),
        ("hook Broken failed in after_settle", True),
        ("hook Broken failed in on_disconnect", True),
    ]


def test_a_failing_on_connect_fails_the_start() -> None:
    class Refuses(WorkerHook):
        async def on_connect(self, connection: object, lost: asyncio.Event) -> None:
            raise OSError("no")

    with pytest.raises(OSError, match="no"):
        asyncio.run(Hooks([Refuses()]).connect(object(), asyncio.Event()))  # type: ignore[arg-type]


def test_the_app_takes_hooks_in_order_and_refuses_what_is_not_one() -> None:
    calls: list[tuple[str, ...]] = []
    first, second = Recorder("a", calls), Recorder("b", calls)
    app = Worker(Settings(prefix="hooks-unit"), hooks=[first])
    assert app.add_hook(second) is second
    assert app.hooks == [first, second]

    @app.handler("jobs")
    async def handle(msg: object) -> None:
        pass

    runner = app.runner()
    mine = runner.hooks.all[-2:]
    assert mine == (first, second)
    assert [type(h).__name__ for h in runner.hooks.all[:-2]] == [
        "CancelFilter",  # first: a cancelled message is neither timed nor logged
        "KeyFilter",
        "RecurringHook",  # after the keys filter: the occurrence is this worker's first
        "MetricsHook",
        "LogHook",
    ]
    with pytest.raises(ConfigurationError, match=r"must be a rmqdelay\.WorkerHook"):
        app.add_hook(object())  # type: ignore[arg-type]


def test_the_cancel_filter_skips_the_named_copy_only() -> None:
    layout = Settings(prefix="hooks-unit").layout
    cancels = CancelFilter(Settings(prefix=layout.prefix, confirm_timeout=5.0))
    due = NOW_MS + 60_000  # due in a minute: its tombstone is held
    cancels.tombstones.add(JournalRecord("cancelled", "m-1", "jobs", due))
    assert cancels.before_handle(_delivery("m-1", due)) is True
    assert cancels.before_handle(_delivery("m-1", due + 1)) is False  # a later re-schedule
    assert cancels.before_handle(_delivery("m-2", due)) is False


def test_the_metrics_hook_counts_outcomes_and_times() -> None:
    hook = MetricsHook()
    dest = {"destination": "jobs"}

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, {**dest, **labels}) or 0.0

    before = {
        o: sample("rmqdelay_messages_total", outcome=o) for o in ("acked", "parked", "returned")
    }
    late, ran = sample("rmqdelay_lateness_seconds_sum"), sample("rmqdelay_handler_seconds_count")
    assert hook.before_handle(_delivery()) is False
    hook.after_settle(_delivery(), Settled("acked", seconds=0.5))
    hook.after_settle(_delivery(), Settled("parked", "bad", seconds=0.25))
    hook.after_settle(_delivery(), Settled("returned", problem="gone"))
    assert sample("rmqdelay_lateness_seconds_sum") == pytest.approx(late + 0.25)
    assert sample("rmqdelay_handler_seconds_count") == ran + 2
    assert sample("rmqdelay_messages_total", outcome="acked") == before["acked"] + 1
    assert sample("rmqdelay_messages_total", outcome="parked") == before["parked"] + 1
    # a returned message comes again, and is counted then
    assert sample("rmqdelay_messages_total", outcome="returned") == before["returned"]


def test_the_log_hook_says_each_outcome_with_the_message_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hook = LogHook()
    caplog.set_level(logging.DEBUG, logger="rmqdelay.worker")
    hook.before_handle(_delivery())
    error = ValueError("boom")
    for settled in (
        Settled("acked", seconds=0.0123),
        Settled("retried", "ValueError: boom", delay_ms=3000, error=error, seconds=0.002),
        Settled("parked", "gave up", error=error, traceback="Traceback...", seconds=0.002),
        Settled("cancelled"),
        Settled("returned", problem="could not settle the message (ChannelClosed)"),
    ):
        hook.after_settle(_delivery(), settled)
    lines = [
        (r.levelname, r.getMessage(), getattr(r, "outcome", None), getattr(r, "duration_ms", None))
        for r in caplog.records
    ]
    assert lines == [
        ("DEBUG", "received", None, None),
        ("INFO", "handled", "acked", 12.3),
        ("WARNING", "retrying", "retried", 2.0),
        ("ERROR", "parked", "parked", 2.0),
        ("INFO", "cancelled", "cancelled", None),
        (
            "WARNING",
            "could not settle the message (ChannelClosed): the broker delivers it again",
            "returned",
            None,
        ),
    ]
    retried, parked = caplog.records[2], caplog.records[3]
    assert (retried.delay_ms, retried.reason) == (3000, "ValueError: boom")  # type: ignore[attr-defined]
    assert parked.traceback == "Traceback..."  # type: ignore[attr-defined]
    assert all(
        (r.message_id, r.destination, r.attempt, r.lateness_ms) == ("m-1", "jobs", 2, 250)  # type: ignore[attr-defined]
        for r in caplog.records
    )


def test_a_delivery_converts_its_times_once_through_the_clock() -> None:
    delivery = _delivery(due_ms=NOW_MS - 1500)
    assert delivery.lateness_ms == 1500
    assert delivery.lateness is not None and delivery.lateness.total_seconds() == 1.5
    assert delivery.due_at is not None and delivery.due_at.timestamp() * 1000 == NOW_MS - 1500
    undated = _delivery(due_ms=None)
    assert (undated.due_at, undated.lateness, undated.lateness_ms) == (None, None, None)
