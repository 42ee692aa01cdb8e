"""Recurring schedules, as data: rules, occurrences, the chain's headers and the fold.

A recurring schedule is a *chain* of ordinary delayed messages. Each occurrence is
published with a key of its own, ``recurring:NAME@<occurrence ms>`` (``on_conflict``
``ignore``), and carries in its headers everything needed to publish the next one: the
name, the occurrence time, the rule, the chain's id and its state. The worker that gets
an occurrence publishes the next one (confirmed) before it calls the handler, and acks
after: a crash anywhere sends the next one again under the same key (ignored while the
first is pending), so no firing is doubled and none is lost.

``add``, ``pause``, ``resume`` and ``remove`` are ``recurring`` control records in the
schedule journal. Because the chain carries its state forward in its headers, it
outlives the journal's ``x-max-age``; where both speak, the later stamp wins.

Every decision here depends on the rule, the headers and the records, never on the
reader's clock, so that two workers handling copies of one occurrence publish the same
next occurrence (the same key).

Cron rules are evaluated by ``cronsim`` (DST as cron does it: a time in a spring-forward
gap fires once right after the gap, a fixed time in the autumn repeat fires once, the
first time; ``*`` hours fire in both repeated hours). ``every`` rules are absolute time
(no DST effect): occurrences at ``anchor + k * every``, the anchor by default the Unix
epoch, so ``every 15m`` fires at :00, :15, :30 and :45 (UTC).

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import RecurringError
from .durations import DurationLike, format_ms, parse_duration_us
from .journal import JournalRecord

__all__ = [
    "CHAIN",
    "OCCURRENCE",
    "RECURRING",
    "RULE",
    "STATE",
    "STATE_AT",
    "Occurrence",
    "OccurrenceDecision",
    "RecurringBook",
    "RecurringOp",
    "RecurringResult",
    "RecurringSchedule",
    "Rule",
    "State",
    "control_record",
    "new_chain",
    "occurrence_key",
    "parse_rule",
    "read_occurrence",
    "rule_of",
    "validate_name",
]

RECURRING = "rmqdelay-recurring"
"""Header: the schedule's name."""
OCCURRENCE = "rmqdelay-occurrence"
"""Header: the occurrence's time, Unix ms (its nominal time; the due time is the same)."""
RULE = "rmqdelay-recurring-rule"
"""Header: the rule as compact JSON (:meth:`Rule.to_json`)."""
CHAIN = "rmqdelay-recurring-chain"
"""Header: the chain's id, ``<add time ms>-<random>``: an ``add`` starts a chain."""
STATE = "rmqdelay-recurring-state"
"""Header: ``active`` or ``paused``, as the chain knew it when this occurrence was sent."""
STATE_AT = "rmqdelay-recurring-state-at"
"""Header: when that state was set (Unix ms of its control record)."""

State = Literal["active", "paused", "removed"]
RecurringOp = Literal["add", "pause", "resume", "remove"]
_OPS = frozenset(("add", "pause", "resume", "remove"))
_NAME = re.compile(r"[A-Za-z0-9._:/-]{1,200}")
MIN_EVERY_MS = 1000
"""The shortest ``every``: each occurrence is a handling, a publish and a journal record."""
_GAP_CHECKS = 2000
"""How many of a cron rule's first gaps are compared with the longest delay."""


def validate_name(name: object) -> str:
    """A schedule's name: letters, digits and ``. _ : / -`` (it goes into keys and ids)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RecurringError(
            f"recurring schedule name {name!r}: use 1 to 200 letters, digits or . _ : / -"
        )
    return name


def occurrence_key(name: str, at_ms: int) -> str:
    """The key of one occurrence: the first publish of it wins, later ones are ignored."""
    return f"recurring:{name}@{at_ms}"


def new_chain(now_ms: int) -> str:
    """A chain id: its start time first, so chains of one name can be ordered."""
    return f"{now_ms}-{secrets.token_hex(4)}"


def chain_ms(chain: str) -> int:
    """The start time a chain id begins with (0 when it has none)."""
    head = chain.split("-", 1)[0]
    return int(head) if head.isdigit() else 0


# ---------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Rule:
    """When a schedule fires: a cron expression in a time zone, or a fixed interval."""

    cron: str | None = None
    tz: str = "UTC"
    every_ms: int | None = None
    anchor_ms: int = 0
    """For ``every``: occurrences fall at ``anchor_ms + k * every_ms``."""

    def next_after(self, after_ms: int) -> int:
        """The first rule time strictly after ``after_ms`` (Unix ms)."""
        if self.every_ms is not None:
            steps = (after_ms - self.anchor_ms) // self.every_ms + 1
            return self.anchor_ms + steps * self.every_ms
        assert self.cron is not None
        from cronsim import CronSim

        zone = ZoneInfo(self.tz)
        # cronsim works in whole seconds and gives times strictly after its start
        start = datetime.fromtimestamp(after_ms // 1000, zone)
        found = next(CronSim(self.cron, start))
        at = int(found.timestamp()) * 1000
        if at <= after_ms:  # a start inside the same second as a rule time
            found = next(CronSim(self.cron, datetime.fromtimestamp(at // 1000, zone)))
            at = int(found.timestamp()) * 1000
        return at

    def upcoming(self, after_ms: int, count: int) -> list[int]:
        """The next ``count`` rule times after ``after_ms``."""
        found: list[int] = []
        at = after_ms
        for _ in range(count):
            at = self.next_after(at)
            found.append(at)
        return found

    def longest_gap_ms(self, after_ms: int) -> int:
        """The longest wait between occurrences: ``every``, or over a cron rule's first
        gaps (enough for any rule that repeats within a year or fires daily)."""
        if self.every_ms is not None:
            return self.every_ms
        from cronsim import CronSim

        zone = ZoneInfo(self.tz)
        times = CronSim(self.cron or "", datetime.fromtimestamp(after_ms // 1000, zone))
        previous = after_ms
        longest = 0
        for _ in range(_GAP_CHECKS):
            at = int(next(times).timestamp()) * 1000
            longest = max(longest, at - previous)
            previous = at
            if at - after_ms > 800 * 86_400_000:
                break
        return longest

    def to_json(self) -> dict[str, Any]:
        if self.every_ms is not None:
            data: dict[str, Any] = {"every": self.every_ms}
            if self.anchor_ms:
                data["anchor"] = self.anchor_ms
            return data
        return {"cron": self.cron, "tz": self.tz}

    def header(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"))

    def describe(self) -> str:
        if self.every_ms is not None:
            return f"every {format_ms(self.every_ms)}"
        return f"cron {self.cron} ({self.tz})"


def parse_rule(
    *,
    cron: str | None = None,
    tz: str | None = None,
    every: DurationLike | None = None,
    anchor_ms: int = 0,
) -> Rule:
    """Check a rule as a user gave it: exactly one of ``cron`` (5 fields, in ``tz``,
    default UTC) and ``every`` (``"15m"``, a timedelta, seconds)."""
    if (cron is None) == (every is None):
        raise RecurringError(
            "give either cron= (a 5-field expression such as '0 9 * * *') or every= "
            "(a duration such as '15m'), not both and not neither"
        )
    if every is not None:
        if tz is not None:
            raise RecurringError(
                f"tz={tz!r} goes with cron=; every= is absolute time and needs no time zone"
            )
        from ..errors import DelayError

        try:
            every_us = parse_duration_us(every)
        except DelayError as exc:
            raise RecurringError(f"every={every!r}: {exc}") from None
        if every_us % 1000:
            raise RecurringError(f"every={every!r}: use whole milliseconds")
        every_ms = every_us // 1000
        if every_ms < MIN_EVERY_MS:
            raise RecurringError(f"every={every!r} is too short: at least 1s")
        return Rule(every_ms=every_ms, anchor_ms=anchor_ms)
    assert cron is not None
    zone_name = tz or "UTC"
    try:
        ZoneInfo(zone_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise RecurringError(
            f"tz={zone_name!r} is not a time zone this machine knows: use an IANA name "
            "such as Europe/Berlin (pip install tzdata where the system has none)"
        ) from None
    from cronsim import CronSim, CronSimError

    try:
        CronSim(cron, datetime.now(timezone.utc))
    except CronSimError as exc:
        raise RecurringError(
            f"cron={cron!r}: {exc} (5 fields: minute hour day-of-month month day-of-week)"
        ) from None
    return Rule(cron=" ".join(cron.split()), tz=zone_name)


def rule_of(data: object) -> Rule:
    """A rule from its JSON (a header or a control record); RecurringError if unreadable."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except ValueError:
            raise RecurringError(f"unreadable recurring rule {data!r}") from None
    if not isinstance(data, Mapping):
        raise RecurringError(f"unreadable recurring rule {data!r}")
    every = data.get("every")
    if isinstance(every, int) and every >= MIN_EVERY_MS:
        anchor = data.get("anchor", 0)
        return Rule(every_ms=every, anchor_ms=anchor if isinstance(anchor, int) else 0)
    cron, tz = data.get("cron"), data.get("tz", "UTC")
    if isinstance(cron, str) and isinstance(tz, str):
        return Rule(cron=cron, tz=tz)
    raise RecurringError(f"unreadable recurring rule {dict(data)!r}")


# ---------------------------------------------------------------------- occurrences


@dataclass(frozen=True)
class Occurrence:
    """What an occurrence's headers say: the chain as it was when it was sent."""

    name: str
    at_ms: int
    rule: Rule
    chain: str
    state: Literal["active", "paused"] = "active"
    state_ms: int = 0

    @property
    def key(self) -> str:
        return occurrence_key(self.name, self.at_ms)

    def headers(self) -> dict[str, Any]:
        """The headers that carry the chain (the user's own headers go beside them)."""
        return {
            RECURRING: self.name,
            OCCURRENCE: self.at_ms,
            RULE: self.rule.header(),
            CHAIN: self.chain,
            STATE: self.state,
            STATE_AT: self.state_ms,
        }

    def following(self, state: Literal["active", "paused"], state_ms: int) -> Occurrence:
        """The next occurrence of the chain: first rule time strictly after this one."""
        return replace(self, at_ms=self.rule.next_after(self.at_ms), state=state, state_ms=state_ms)


def read_occurrence(headers: Mapping[str, Any] | None) -> Occurrence | None:
    """The occurrence a message's headers describe; None for a message of no schedule.
    A message that names a schedule but whose chain headers are unreadable raises
    RecurringError (the worker then handles it as a plain message and says so)."""
    if not headers or RECURRING not in headers:
        return None
    name = _text(headers.get(RECURRING))
    at = headers.get(OCCURRENCE)
    chain = _text(headers.get(CHAIN))
    state = _text(headers.get(STATE)) or "active"
    state_at = headers.get(STATE_AT, 0)
    if not name or not isinstance(at, int) or isinstance(at, bool) or not chain:
        raise RecurringError(f"occurrence of {name!r} without readable chain headers")
    if state not in ("active", "paused"):
        raise RecurringError(f"occurrence of {name!r} with an unknown state {state!r}")
    rule = rule_of(_text(headers.get(RULE)))
    stamp = state_at if isinstance(state_at, int) and not isinstance(state_at, bool) else 0
    return Occurrence(name, at, rule, chain, state, stamp)  # type: ignore[arg-type]


def _text(value: object) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode(errors="replace")
    return value if isinstance(value, str) else ""


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
