"""Holding early deliveries, pure: the hand-over/hold/re-delay decision, the heap of
held ones by due time, and when the count says max_held is reached."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from rmqdelay.core.clock import now_ms
from rmqdelay.core.handling.hold import SLACK_MS, HeldCount, HoldHeap, hold_action
from rmqdelay.worker.holding import Held, Holder
from rmqdelay.worker.metrics import HELD

times = st.integers(0, 2**45)


@given(due=st.none() | times, now=times, hold_ms=st.integers(1, 60_000))
def test_never_handed_over_early_and_never_held_past_the_window(
    due: int | None, now: int, hold_ms: int
) -> None:
    action = hold_action(due, now, hold_ms)
    if due is None or due <= now:
        assert action == "handle"
    elif due - now <= hold_ms + SLACK_MS:
        assert action == "hold"
    else:
        assert action == "redelay"
    if action == "handle":
        assert due is None or due <= now  # never early


def test_the_edges() -> None:
    assert hold_action(1000, 1000, 2560) == "handle"
    assert hold_action(1001, 1000, 2560) == "hold"
    assert hold_action(1000 + 2560 + SLACK_MS, 1000, 2560) == "hold"
    assert hold_action(1001 + 2560 + SLACK_MS, 1000, 2560) == "redelay"


@given(dues=st.lists(st.integers(0, 10_000), max_size=60), now=st.integers(0, 10_000))
def test_the_heap_gives_what_is_due_earliest_first_in_arrival_order(
    dues: list[int], now: int
) -> None:
    heap: HoldHeap[int] = HoldHeap()
    for index, due in enumerate(dues):
        earliest = heap.push(due, index)
        assert earliest == (due < min(dues[:index], default=due + 1))
    out = heap.pop_due(now)
    expected = sorted((d, i) for i, d in enumerate(dues) if d <= now)
    assert out == [i for _, i in expected]
    rest = sorted((d, i) for i, d in enumerate(dues) if d > now)
    assert len(heap) == len(rest)
    assert heap.next_due() == (rest[0][0] if rest else None)
    assert heap.drain() == [i for _, i in rest]
    assert len(heap) == 0 and heap.next_due() is None


@given(dues=st.lists(st.integers(0, 1000), max_size=40), gone=st.sets(st.integers(0, 39)))
def test_removed_items_never_come_out(dues: list[int], gone: set[int]) -> None:
    heap: HoldHeap[int] = HoldHeap()
    for index, due in enumerate(dues):
        heap.push(due, index)
    taken = heap.remove(lambda i: i in gone)
    assert sorted(taken) == sorted(gone & set(range(len(dues))))
    assert heap.pop_due(1000) == [
        i for _, i in sorted((d, i) for i, d in enumerate(dues)) if i not in gone
    ]


def test_max_held_is_told_once_until_the_count_falls_to_half() -> None:
    count = HeldCount(4)
    assert [count.add() for _ in range(6)] == [False, False, False, True, False, False]
    count.remove(3)  # 3 held: still over half
    assert not count.add()
    count.remove(2)  # 2 held: half
    assert [count.add() for _ in range(2)] == [False, True]
    count.remove(10)
    assert count.count == 0


async def test_the_holder_releases_each_at_its_due_time_by_one_timer() -> None:
    """The worker's holder, without a broker: released in due order, never early, and
    the gauge back to 0; a session's taken-back items are never released."""
    released: list[tuple[int, int]] = []
    done = asyncio.Event()

    def release(held: Held) -> None:
        released.append((held.due_ms, now_ms()))
        if len(released) == 3:
            done.set()

    holder = Holder(2, release)
    spec: Any = SimpleNamespace(destination="unit-held")
    kept: Any = SimpleNamespace()
    lost: Any = SimpleNamespace(settler=SimpleNamespace(acks=SimpleNamespace(forget=print)))
    message: Any = SimpleNamespace(consumer_tag="t")
    start = now_ms()
    for offset in (80, 20, 50):
        holder.hold(kept, spec, message, None, start + offset)  # type: ignore[arg-type]
    holder.hold(lost, spec, message, None, start + 30)  # type: ignore[arg-type]
    assert HELD.labels("unit-held")._value.get() == 4
    assert holder.taken_back(lost, None) == 1
    await asyncio.wait_for(done.wait(), 5)
    assert [due for due, _ in released] == [start + 20, start + 50, start + 80]
    assert all(at >= due for due, at in released)
    assert len(holder) == 0 and HELD.labels("unit-held")._value.get() == 0
