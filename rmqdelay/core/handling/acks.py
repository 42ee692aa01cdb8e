"""Which of a channel's deliveries may be acked now, and how: the worker's ack batching.

A channel numbers its deliveries 1, 2, 3, ... A ``basic.ack`` with ``multiple`` acks
every delivery up to its tag that the broker still holds unacked, so it may only go out
when each of those is done (its handler succeeded, any republish confirmed) or no longer
the broker's to settle here (rejected, nacked, acked alone, or taken back). The ledger
knows each tag's state; :meth:`AckLedger.take` says what to send: one ``multiple`` ack
for the done run from the lowest unsettled tag up, and a single ack for each done tag
past a gap (a handler still running, a reject on its way). A tag with a frame on its
way (``SENDING``) blocks the run until that frame is out, so no two frames ever cover
the same tag, whatever order they leave in.

Pure: the worker (:mod:`rmqdelay.worker.acks`) sends the frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

__all__ = ["AckLedger", "AckPlan", "TagState"]


class TagState(Enum):
    OPEN = "open"
    """Delivered; its handling has not ended."""
    DONE = "done"
    """To be acked."""
    SENDING = "sending"
    """A frame for it alone (a single ack, a reject, a nack) is on its way."""
    SETTLED = "settled"
    """Not the broker's to settle on this channel any more."""


@dataclass(frozen=True)
class AckPlan:
    """What to send now: ``multiple`` (a tag, or None) as one ``basic.ack`` with
    ``multiple=True`` (it covers ``covered`` deliveries), and ``singles``, each acked alone.
    Every tag in ``singles`` is ``SENDING`` until :meth:`AckLedger.sent` is told."""

    multiple: int | None
    covered: int
    singles: tuple[int, ...]

    def __bool__(self) -> bool:
        return self.multiple is not None or bool(self.singles)


class AckLedger:
    """The states of one channel's unsettled deliveries (tags above ``floor``)."""

    def __init__(self) -> None:
        self.floor = 0
        """Every tag up to this one is settled (acked, or no longer the broker's)."""
        self._tags: dict[int, TagState] = {}
        self._done = 0

    def __len__(self) -> int:
        return len(self._tags)

    def state(self, tag: int) -> TagState:
        if tag <= self.floor:
            return TagState.SETTLED
        return self._tags.get(tag, TagState.OPEN)

    @property
    def pending(self) -> int:
        """Tags to be acked (DONE), not yet in a plan."""
        return self._done

    def delivered(self, tag: int) -> None:
        """A delivery arrived with ``tag``."""
        if tag > self.floor and tag not in self._tags:
            self._tags[tag] = TagState.OPEN

    def done(self, tag: int) -> None:
        """``tag``'s handling ended well: ack it with the next plan."""
        self._move(tag, TagState.DONE, (TagState.OPEN,))

    def sending(self, tag: int) -> None:
        """A frame for ``tag`` alone (a reject, a nack) is about to be sent."""
        self._move(tag, TagState.SENDING, (TagState.OPEN,))

    def sent(self, tag: int) -> None:
        """The frame for ``tag`` alone is out (or the tag is no longer the broker's:
        taken back, or its channel lost)."""
        state = self.state(tag)
        if state is TagState.SETTLED:
            return
        if state is TagState.DONE:
            self._done -= 1
        self._tags[tag] = TagState.SETTLED

    def forget(self, tag: int) -> None:
        """The broker took ``tag`` back (its consumer was cancelled, its channel lost): it
        no longer holds back the acks after it. A tag already asked to be settled keeps
        its way (a frame on its way must still go out before a batch covers it)."""
        if self.state(tag) is TagState.OPEN:
            self._tags[tag] = TagState.SETTLED

    def _move(self, tag: int, to: TagState, allowed: tuple[TagState, ...]) -> None:
        state = self.state(tag)
        if state not in allowed:
            raise ValueError(f"delivery tag {tag} is {state.value}, cannot become {to.value}")
        self._tags[tag] = to
        if to is TagState.DONE:
            self._done += 1

    def take(self) -> AckPlan:
        """What to send for every DONE tag; they leave the ledger (the run) or become
        SENDING (the singles)."""
        tags = self._tags
        top: int | None = None
        covered = 0
        floor = self.floor
        while True:
            state = tags.get(floor + 1)
            if state is TagState.DONE:
                top = floor + 1
                covered += 1
            elif state is not TagState.SETTLED:
                break
            floor += 1
            del tags[floor]
        self.floor = floor
        self._done -= covered
        singles: tuple[int, ...] = ()
        if self._done:
            singles = tuple(t for t, s in tags.items() if s is TagState.DONE)
            for tag in singles:
                tags[tag] = TagState.SENDING
            self._done = 0
        return AckPlan(top, covered, singles)

    def lost(self) -> None:
        """The channel is gone: the broker takes back whatever it held."""
        self._tags.clear()
        self._done = 0
