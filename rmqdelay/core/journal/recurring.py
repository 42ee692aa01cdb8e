"""Recurring schedules, as the journal folds them: control records, and the book of schedules.

A recurring schedule is a *chain* of ordinary delayed messages. Each occurrence is
published with a key of its own, ``recurring:NAME@<occurrence ms>`` (``on_conflict``
``ignore``), and carries in its headers everything needed to publish the next one: the
name, the occurrence time, the rule, the chain's id and its state. The worker that gets
an occurrence publishes the next one (confirmed) before it calls the handler, and acks
after: a crash anywhere sends the next one again under the same key (ignored while the
first is pending), so no firing is doubled and none is lost.

``add``, ``pause``, ``resume`` and ``remove`` are ``recurring`` control records in the
schedule journal. Because the chain carries its state forward in its headers, it
outlives the journal's retention; where both speak, the later stamp wins.

What a worker does with an occurrence depends on the records and its headers alone,
never on the reader's clock (:mod:`.rules` says when a rule fires).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ...errors import RecurringError
from ..clock import iso_of_ms
from .records import JournalRecord
from .rules import (
    RECURRING,
    Occurrence,
    RecurringOp,
    Rule,
    State,
    chain_ms,
    read_occurrence,
    rule_of,
)

__all__ = [
    "OccurrenceDecision",
    "RecurringBook",
    "RecurringResult",
    "RecurringSchedule",
    "control_record",
]


# ------------------------------------------------------------------ control records


def control_record(
    name: str,
    op: RecurringOp,
    now_ms: int,
    *,
    rule: Rule | None = None,
    chain: str | None = None,
    destination: str = "",
) -> JournalRecord:
    """A ``recurring`` control record: ``add`` carries the rule and the chain it starts;
    ``pause``, ``resume`` and ``remove`` act on the name's current chain."""
    data: dict[str, Any] = {"op": op}
    if op == "add":
        assert rule is not None and chain is not None
        data |= {"rule": rule.to_json(), "chain": chain}
    return JournalRecord("recurring", name, destination, recorded_at_ms=now_ms, data=data)


# -------------------------------------------------------------------------- the fold


@dataclass
class RecurringSchedule:
    """One schedule as the journal and its occurrences tell it."""

    name: str
    destination: str
    rule: Rule
    chain: str
    state: State = "active"
    state_ms: int = 0
    occurrences: set[int] = field(default_factory=set, repr=False)
    """Occurrence times recorded (``scheduled`` records of this chain)."""
    message_ids: dict[int, str] = field(default_factory=dict, repr=False)

    def next_occurrence(self, now_ms: int) -> int | None:
        ahead = [at for at in self.occurrences if at > now_ms]
        return min(ahead) if ahead else None

    def last_occurrence(self, now_ms: int) -> int | None:
        past = [at for at in self.occurrences if at <= now_ms]
        return max(past) if past else None

    def to_json(self, now_ms: int) -> dict[str, Any]:
        return {
            "name": self.name,
            "destination": self.destination,
            "rule": self.rule.to_json(),
            "describe": self.rule.describe(),
            "state": self.state,
            "chain": self.chain,
            "next_ms": self.next_occurrence(now_ms),
            "last_ms": self.last_occurrence(now_ms),
        }


OccurrenceAction = Literal["run", "skip", "drop"]


@dataclass(frozen=True)
class OccurrenceDecision:
    """What a worker does with an occurrence: ``run`` (publish the next one, then call
    the handler), ``skip`` (paused: publish the next one, ack, no handler) or ``drop``
    (removed, or a chain replaced by a later ``add``: ack, no handler, no next one)."""

    action: OccurrenceAction
    reason: str
    following: Occurrence | None = None
    """The next occurrence to publish first (for ``run`` and ``skip``)."""


_ENTRIES = frozenset(("sched", "switch", "removed"))
"""The checkpoint entries of this book."""
_HISTORY = 64
"""Occurrence times kept per schedule (for next/last in ``recurring list``)."""


class RecurringBook:
    """Every schedule, from the control records and the occurrences' ``scheduled``
    records, in journal order.

    A schedule's state is a function of the *set* of records read, so reading a record
    again (a tail that reconnects) changes nothing: the base state an ``add`` or an
    occurrence's headers give, the latest ``pause``/``resume`` stamped at or after the
    chain's start if it is later, and ``removed`` once a ``remove`` stamped at or after
    the chain's start is read (a removed chain stays removed; an ``add`` starts a new one).
    """

    def __init__(self) -> None:
        self.schedules: dict[str, RecurringSchedule] = {}
        self._switch: dict[str, tuple[int, str]] = {}
        """Per name, the latest pause or resume: (stamp, op)."""
        self._removed: dict[str, int] = {}
        """Per name, the latest remove's stamp."""

    @staticmethod
    def wants(line: bytes) -> bool:
        """Whether a journal line can matter here: a control record or an occurrence."""
        return b"rmqdelay-recurring" in line or b'"k":"recurring"' in line

    def add(self, record: JournalRecord) -> None:
        if record.kind == "recurring":
            self._control(record)
        elif record.kind == "scheduled" and RECURRING in record.headers:
            try:
                occurrence = read_occurrence(record.headers)
            except RecurringError:
                return
            if occurrence is not None:
                self._occurrence(occurrence, record)

    def extend(self, records: Iterable[JournalRecord]) -> RecurringBook:
        for record in records:
            self.add(record)
        return self

    def _control(self, record: JournalRecord) -> None:
        name, op, stamp = record.message_id, record.data.get("op"), record.recorded_at_ms
        if op == "add":
            try:
                rule = rule_of(record.data.get("rule"))
            except RecurringError:
                return
            chain = record.data.get("chain")
            if not isinstance(chain, str) or not chain:
                return
            self._adopt(RecurringSchedule(name, record.destination, rule, chain, "active", stamp))
        elif op == "remove":
            self._removed[name] = max(stamp, self._removed.get(name, stamp))
        elif op in ("pause", "resume"):
            self._switch[name] = max((stamp, op), self._switch.get(name, (stamp, op)))

    def _adopt(self, schedule: RecurringSchedule) -> RecurringSchedule | None:
        """Keep a chain seen by an add or an occurrence: the name's latest chain wins,
        and for one chain the later base state; None for a chain replaced since."""
        known = self.schedules.get(schedule.name)
        if known is None or chain_ms(schedule.chain) > chain_ms(known.chain):
            self.schedules[schedule.name] = schedule
            return schedule
        if known.chain != schedule.chain:
            return None
        if schedule.state_ms > known.state_ms:
            known.state, known.state_ms = schedule.state, schedule.state_ms
        if not known.destination:
            known.destination = schedule.destination
        return known

    def _occurrence(self, occurrence: Occurrence, record: JournalRecord) -> None:
        known = self._adopt(
            RecurringSchedule(
                occurrence.name,
                record.destination,
                occurrence.rule,
                occurrence.chain,
                occurrence.state,
                occurrence.state_ms,
            )
        )
        if known is None:
            return  # an occurrence of a chain replaced since
        known.occurrences.add(occurrence.at_ms)
        known.message_ids[occurrence.at_ms] = record.message_id
        if len(known.occurrences) > _HISTORY:
            oldest = min(known.occurrences)
            known.occurrences.discard(oldest)
            known.message_ids.pop(oldest, None)

    def state_of(self, name: str, chain: str, state: State, stamp: int) -> tuple[State, int]:
        """A chain's state: ``state`` at ``stamp`` (its base) against the journal's."""
        start = chain_ms(chain)
        removed = self._removed.get(name)
        if removed is not None and removed >= start:
            return "removed", removed
        switch = self._switch.get(name)
        if switch is not None and switch[0] >= start and switch[0] >= stamp:
            return ("paused" if switch[1] == "pause" else "active"), switch[0]
        return state, stamp

    def effective(self, schedule: RecurringSchedule) -> tuple[State, int]:
        return self.state_of(schedule.name, schedule.chain, schedule.state, schedule.state_ms)

    def decide(self, occurrence: Occurrence) -> OccurrenceDecision:
        """What to do with an occurrence delivered: the later of its headers' state and
        the journal's decides; a chain older than the name's current one is dropped."""
        known = self.schedules.get(occurrence.name)
        state: State = occurrence.state
        stamp = occurrence.state_ms
        if known is not None:
            if known.chain != occurrence.chain:
                if chain_ms(known.chain) >= chain_ms(occurrence.chain):
                    return OccurrenceDecision("drop", "replaced")
                # a newer chain than the journal has shown this reader yet: its headers
            elif known.state_ms > stamp:
                state, stamp = known.state, known.state_ms
        state, stamp = self.state_of(occurrence.name, occurrence.chain, state, stamp)
        if state == "removed":
            return OccurrenceDecision("drop", "removed")
        following = occurrence.following(state, stamp)
        if state == "paused":
            return OccurrenceDecision("skip", "paused", following)
        return OccurrenceDecision("run", "active", following)

    # ------------------------------------------------------------------ checkpoints

    def clear(self) -> None:
        """Forget everything, for a fold begun again from a checkpoint."""
        self.schedules.clear()
        self._switch.clear()
        self._removed.clear()

    def entries(self) -> Iterator[dict[str, Any]]:
        """The book as checkpoint entries (:mod:`.checkpoint`): each schedule, then the
        latest pause or resume and the latest remove of each name."""
        for schedule in self.schedules.values():
            yield {
                "s": "sched",
                "name": schedule.name,
                "d": schedule.destination,
                "rule": schedule.rule.to_json(),
                "chain": schedule.chain,
                "st": schedule.state,
                "sm": schedule.state_ms,
                "occ": [[at, schedule.message_ids.get(at)] for at in sorted(schedule.occurrences)],
            }
        for name, (stamp, op) in self._switch.items():
            yield {"s": "switch", "name": name, "t": stamp, "op": op}
        for name, stamp in self._removed.items():
            yield {"s": "removed", "name": name, "t": stamp}

    def restore(self, entry: Mapping[str, Any]) -> None:
        """Take back one entry of :meth:`entries` (a checkpoint's others are passed over)."""
        kind = entry["s"]
        if kind not in _ENTRIES:
            return
        name = str(entry["name"])
        if kind == "sched":
            schedule = RecurringSchedule(
                name,
                str(entry["d"]),
                rule_of(entry["rule"]),
                str(entry["chain"]),
                entry["st"],
                int(entry["sm"]),
            )
            for at, message_id in entry["occ"]:
                schedule.occurrences.add(int(at))
                if message_id is not None:
                    schedule.message_ids[int(at)] = str(message_id)
            self.schedules[name] = schedule
        elif kind == "switch":
            self._switch[name] = (int(entry["t"]), str(entry["op"]))
        elif kind == "removed":
            self._removed[name] = int(entry["t"])

    def expire(self, now_ms: int, horizon_ms: int) -> None:
        """Forget schedules removed more than ``horizon_ms`` ago (the longest delay and a
        margin: no occurrence of theirs can come any more), and their stamps."""
        cutoff = now_ms - horizon_ms
        for name in [n for n, stamp in self._removed.items() if stamp < cutoff]:
            schedule = self.schedules.get(name)
            if schedule is not None and chain_ms(schedule.chain) > self._removed[name]:
                del self._removed[name]  # a newer chain: the remove no longer speaks
            elif schedule is None or self.effective(schedule)[0] == "removed":
                self.schedules.pop(name, None)
                self._switch.pop(name, None)
                del self._removed[name]

    def counts(self) -> dict[str, int]:
        """Schedules by state, the removed ones left out (``status``, the gauge)."""
        found = {"active": 0, "paused": 0}
        for schedule in self.schedules.values():
            state, _ = self.effective(schedule)
            if state in found:
                found[state] += 1
        return found

    def listed(self, *, include_removed: bool = False) -> list[RecurringSchedule]:
        """Every schedule by name, its ``state`` the effective one."""
        found = []
        for name in sorted(self.schedules):
            schedule = self.schedules[name]
            state, stamp = self.effective(schedule)
            if include_removed or state != "removed":
                found.append(replace(schedule, state=state, state_ms=stamp))
        return found


@dataclass(frozen=True)
class RecurringResult:
    """What ``add``, ``pause``, ``resume`` or ``remove`` did to a schedule.

    ``outcome``: ``added``; ``exists`` (an add of a schedule already there with the same
    rule and destination: nothing new); ``paused``, ``resumed``, ``removed``;
    ``unknown`` (no such schedule in the journal).
    """

    name: str
    outcome: Literal["added", "exists", "paused", "resumed", "removed", "unknown"]
    rule: str = ""
    destination: str = ""
    next_ms: int | None = None
    """The pending occurrence (the first one for ``added``), when known."""
    message_id: str | None = None
    cancelled: tuple[str, ...] = ()
    """For ``removed``: the pending occurrences' message ids a tombstone now names."""

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "outcome": self.outcome,
            "rule": self.rule,
            "destination": self.destination,
            "next_ms": self.next_ms,
            "message_id": self.message_id,
            "cancelled": list(self.cancelled),
        }

    def describe(self) -> str:
        """The answer in words, as ``rmqdelay recurring`` and the dashboard say it."""
        if self.outcome == "unknown":
            return f"{self.name}: unknown (no such schedule in the schedule journal)"
        said = f"{self.name}: {self.outcome}"
        if self.rule:
            said += f" ({self.rule} to {self.destination})"
        if self.next_ms is not None:
            said += f", next {iso_of_ms(self.next_ms)}"
        if self.cancelled:
            said += f", cancelled the pending occurrence ({', '.join(self.cancelled)})"
        return said + _MEANS.get(self.outcome, "")


_MEANS = {
    "paused": ": its occurrences go on, no handler runs until it is resumed",
    "resumed": ": from its next occurrence (those missed while paused are not run late)",
}
