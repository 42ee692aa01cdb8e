"""Deliveries that come before their due time, pure: hand over, hold, or send round again.

A held destination's messages skip the tiers' lowest digits and reach the work queue up to
one hold window early (``Layout.hold_ms``); any destination's may come a little early
when a publisher's clock is ahead of the worker's. The worker holds such a delivery
unacked until its ``rmqdelay-due-at`` by its own clock, and never hands it to a handler
before. Holding is bounded in time, because the broker's consumer timeout (30 min by
default) takes back a message held too long: one due more than the window (and a slack
for clocks and the route) ahead is not held but published again due at the same time,
as a retry is, and that copy comes back within the window. And it is bounded in number:
:class:`HeldCount` says when a destination reaches ``max_held``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from typing import Generic, Literal, TypeVar

__all__ = ["SLACK_MS", "HeldCount", "HoldAction", "HoldHeap", "hold_action"]

T = TypeVar("T")

SLACK_MS = 1000
"""How far past the hold window a delivery may be due and still be held: publishers'
clocks ahead of the worker's, and a route that took less time than planned."""

HoldAction = Literal["handle", "hold", "redelay"]


def hold_action(
    due_ms: int | None, now_ms: int, hold_ms: int, slack_ms: int = SLACK_MS
) -> HoldAction:
    """``handle`` a delivery due by ``now_ms`` (or with no due time), ``hold`` one due
    within ``hold_ms + slack_ms``, ``redelay`` one due later than that."""
    if due_ms is None or due_ms <= now_ms:
        return "handle"
    if due_ms - now_ms <= hold_ms + slack_ms:
        return "hold"
    return "redelay"


class HoldHeap(Generic[T]):
    """Held items by due time, earliest first (ties in arrival order): the worker keeps
    one timer, for :meth:`next_due`, instead of one per message."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, T]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, due_ms: int, item: T) -> bool:
        """Add ``item``; True when it is now the earliest (the timer must move)."""
        entry = (due_ms, next(self._seq), item)
        heapq.heappush(self._heap, entry)
        return self._heap[0] is entry

    def next_due(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now_ms: int) -> list[T]:
        """The items due by ``now_ms``, earliest first, taken out."""
        due: list[T] = []
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            due.append(heapq.heappop(heap)[2])
        return due

    def remove(self, gone: Callable[[T], bool]) -> list[T]:
        """Take out the items ``gone`` picks (their consumer lost them); what was taken."""
        kept: list[tuple[int, int, T]] = []
        taken: list[tuple[int, int, T]] = []
        for entry in self._heap:
            (taken if gone(entry[2]) else kept).append(entry)
        if taken:
            heapq.heapify(kept)
            self._heap = kept
        return [entry[2] for entry in taken]

    def drain(self) -> list[T]:
        """Take out everything (the worker stops), earliest first."""
        items = [entry[2] for entry in sorted(self._heap)]
        self._heap = []
        return items

    def __iter__(self) -> Iterator[T]:
        return (entry[2] for entry in self._heap)


class HeldCount:
    """How many messages a destination holds, against ``most``: :meth:`add` says once
    when the count reaches it (the worker logs that it takes no more until some are due),
    and says it again only after the count fell to half (no line per message at the edge)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.count = 0
        self._told = False

    def add(self) -> bool:
        """One more held; True when this one reaches ``most`` and it was not said yet."""
        self.count += 1
        if self.count >= self.most and not self._told:
            self._told = True
            return True
        return False

    def remove(self, n: int = 1) -> None:
        self.count = max(0, self.count - n)
        if self.count <= self.most // 2:
            self._told = False
