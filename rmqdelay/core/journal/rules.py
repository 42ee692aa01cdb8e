"""Recurring schedules' rules and occurrences: when a schedule fires, and what an
occurrence's headers carry.

A recurring schedule is a *chain* of ordinary delayed messages (:mod:`.recurring`). Each
occurrence carries in its headers everything needed to publish the next one: the name,
the occurrence time, the rule, the chain's id and its state. Every decision here depends
on the rule and the headers, never on the reader's clock, so that two workers handling
copies of one occurrence publish the same next occurrence (the same key).

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
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ...errors import RecurringError
from ..durations import DurationLike, format_ms, parse_duration_us
from .keys import recurring_key

__all__ = [
    "CHAIN",
    "MIN_EVERY_MS",
    "OCCURRENCE",
    "RECURRING",
    "RULE",
    "STATE",
    "STATE_AT",
    "Occurrence",
    "RecurringOp",
    "Rule",
    "State",
    "chain_ms",
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
    return recurring_key(name, at_ms)


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
        from ...errors import DelayError

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
