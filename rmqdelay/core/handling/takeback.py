"""Messages the broker took back while their handler ran, and what their redelivery gets.

Pure. A consumer timeout (RabbitMQ 4.3 cancels the consumer with ``basic.cancel``; 3.10
to 4.2 close the channel) or a lost connection gives a message back to its queue while
the worker's handler still runs on it. The handler is not stopped: it runs to its end,
but its delivery can no longer be settled (4.3 ignores a late ack, measured; before, the
channel is gone). So the worker records that handling here, and when the broker delivers
the same message to it again, the redelivery is not handled a second time: it waits for
the first handling to end, then gets its outcome (ack, retry, park or requeue), once.

A redelivery that reaches another worker is handled there again: the message is handled
once more at most for each take-back. An outcome nobody claimed is forgotten after
``keep_ms`` (or when ``most`` are kept): the redelivery went elsewhere.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, Literal, TypeAlias, TypeVar

__all__ = ["Claim", "Key", "TakenBack", "key_of"]

T = TypeVar("T")

Key = tuple[str, int | None, int]
"""A handling of a message: its id, its due time (ms, None when it has none) and the
attempt; a retry or a re-schedule of the same id is another handling."""

Claim: TypeAlias = Literal["handle", "wait"] | T
"""What a delivery gets: ``handle`` it (nothing known), ``wait`` for the handling the broker
took back to end, or the outcome that handling came to (the worker's: its decision, the
handler's error), to carry out once."""

KEEP_MS = 15 * 60_000
MOST = 10_000


def key_of(message_id: str, due_ms: int | None, attempt: int) -> Key:
    return (message_id, due_ms, attempt)


@dataclass
class _Entry(Generic[T]):
    times: int
    """How often the broker took this handling's message back (once per consumer timeout)."""
    outcome: T | None = None
    """None while the handler runs; then what its redelivery gets."""
    ended_ms: int = 0


class TakenBack(Generic[T]):
    """The handlings of one worker whose message the broker took back; ``T`` is what a
    handling came to (for the worker, its decision and the handler's error)."""

    def __init__(self, keep_ms: int = KEEP_MS, most: int = MOST) -> None:
        self.keep_ms = keep_ms
        self.most = most
        self._entries: OrderedDict[Key, _Entry[T]] = OrderedDict()
        self._outcomes = 0
        """How many entries hold an outcome (the others' handlers run)."""

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def running(self, key: Key) -> bool:
        """Whether the handler of a taken-back message still runs."""
        entry = self._entries.get(key)
        return entry is not None and entry.outcome is None

    def took_back(self, key: Key) -> int:
        """The broker took ``key``'s message back while its handler ran (again, for a
        redelivery that waits for it and was taken back too): how often so far."""
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry[T](0)
        elif entry.outcome is not None:
            return entry.times  # it ended already: its outcome waits for the redelivery
        entry.times += 1
        return entry.times

    def finished(self, key: Key, outcome: T, now_ms: int) -> None:
        """The handler of a taken-back message ended with ``outcome``, which its delivery
        could not be settled with: keep it for the redelivery."""
        entry = self._entries.pop(key, None) or _Entry[T](1)
        if entry.outcome is None:
            self._outcomes += 1
        entry.outcome, entry.ended_ms = outcome, now_ms
        self._entries[key] = entry  # the newest last: the oldest outcomes go first
        self.expire(now_ms)

    def forget(self, key: Key) -> None:
        """The handling ended without an outcome to give (it failed inside the worker, or
        its delivery was settled after all): a redelivery is handled afresh."""
        entry = self._entries.pop(key, None)
        if entry is not None and entry.outcome is not None:
            self._outcomes -= 1

    def claim(self, key: Key, now_ms: int) -> Claim[T]:
        """What a delivery of ``key`` gets; an outcome is given once, then forgotten."""
        self.expire(now_ms)
        entry = self._entries.get(key)
        if entry is None:
            return "handle"
        if entry.outcome is None:
            return "wait"
        del self._entries[key]
        self._outcomes -= 1
        return entry.outcome

    def expire(self, now_ms: int) -> None:
        """Forget outcomes older than ``keep_ms``, and the oldest past ``most`` outcomes;
        never a running handling."""
        if not self._outcomes:
            return
        extra = self._outcomes - self.most
        doomed = []
        for key, entry in self._entries.items():  # ended ones in the order they ended
            if entry.outcome is None:
                continue
            if extra <= 0 and now_ms - entry.ended_ms < self.keep_ms:
                break
            doomed.append(key)
            extra -= 1
        for key in doomed:
            del self._entries[key]
        self._outcomes -= len(doomed)
