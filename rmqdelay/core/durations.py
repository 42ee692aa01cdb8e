"""Durations as exact integers of microseconds.

Floats such as ``0.3`` would round ``0.3 s / 10 ms`` up to 31 units; reading every
input exactly from its shortest decimal form (``Decimal`` for floats, ``Fraction`` for
text) keeps the arithmetic exact, and rounding up keeps a message from ever being early.
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction

from ..errors import DelayError
from .clock import datetime_of_ms, now_ms, us_of_timedelta

__all__ = [
    "DurationLike",
    "format_ms",
    "parse_duration_us",
    "parse_time",
    "parse_time_or_duration",
]

DurationLike = timedelta | int | float | str
"""A timedelta, a number of seconds, or a string such as ``"1.5s"`` or ``"2h30m"``."""

_UNIT_US = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
    "w": 604_800_000_000,
}
_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*(us|ms|s|m|h|d|w)")
_EXPONENT = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)e([+-]?\d+)$")
_MAX_EXPONENT = 64
_HUGE_US = 10**70
_FORMAT_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1))


def _ceil_us(value: Fraction) -> int:
    return math.ceil(value)


def parse_duration_us(value: DurationLike, *, what: str = "delay") -> int:
    """Return ``value`` as whole microseconds, rounded up; raise DelayError if invalid.

    Negative values are returned as they are, so callers can tell "in the past".
    """
    if isinstance(value, bool):
        raise DelayError(f"{what} must be a duration, not a bool ({value!r})")
    if isinstance(value, timedelta):
        return us_of_timedelta(value)
    if isinstance(value, int):
        return value * 1_000_000
    if isinstance(value, float):
        if not math.isfinite(value):
            raise DelayError(f"{what} must be a finite number of seconds, got {value!r}")
        # Decimal reads the same shortest form as Fraction would, in a quarter of the time
        return math.ceil(Decimal(repr(value)) * 1_000_000)
    if isinstance(value, str):
        return _parse_text(value, what)
    raise DelayError(
        f"{what} must be a timedelta, a number of seconds or a string like '1.5s', "
        f"'15m' or '2h30m'; got {type(value).__name__}"
    )


def _parse_text(text: str, what: str) -> int:
    raw = text.strip().lower()
    sign = 1
    if raw.startswith("-"):
        sign, raw = -1, raw[1:].strip()
    if raw in {"nan", "inf", "infinity"}:
        raise DelayError(f"{what} must be finite, got {text!r}")
    exponent = _EXPONENT.match(raw)
    if exponent and abs(int(exponent.group(2))) > _MAX_EXPONENT:
        # Fraction would compute 10**exponent: minutes for "1e100000000". Past 1e64 s
        # every maximum is exceeded; below 1e-64 s the delay rounds up to 1 us.
        mantissa = Fraction(exponent.group(1))
        if mantissa == 0:
            return 0
        return sign * (_HUGE_US if int(exponent.group(2)) > 0 else 1)
    try:  # a bare number means seconds, as for int and float
        return sign * _ceil_us(Fraction(raw) * 1_000_000)
    except (ValueError, ZeroDivisionError):
        pass
    total = Fraction(0)
    pos = 0
    for match in _PART.finditer(raw):
        if raw[pos : match.start()].strip():
            break
        total += Fraction(match.group(1)) * _UNIT_US[match.group(2)]
        pos = match.end()
    if pos == 0 or raw[pos:].strip():
        raise DelayError(
            f"cannot read {what} {text!r}: use a number of seconds or parts like "
            "'250ms', '1.5s', '15m', '2h30m', '1d' (units: us, ms, s, m, h, d, w)"
        )
    return sign * _ceil_us(total)


def format_ms(ms: int) -> str:
    """Write milliseconds readably for object names: ``7680`` gives ``"7s680ms"``."""
    if ms == 0:
        return "0ms"
    parts = []
    rest = ms
    for unit, size in _FORMAT_UNITS:
        count, rest = divmod(rest, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def parse_time(text: str, what: str = "--at") -> datetime:
    """A time as a user types it: ISO 8601 with a timezone (``Z`` too); DelayError
    naming *what* otherwise."""
    at = _iso(text, what)
    if at is None:
        raise DelayError(f"{what} {text!r} is not ISO 8601, e.g. 2026-11-21T15:00:00+00:00")
    return at


def parse_time_or_duration(text: str, what: str = "--due-before") -> datetime:
    """A time (ISO 8601) or a duration from now (``10m``): ``scheduled list
    --due-before`` and the dashboard's time fields read the same; DelayError naming
    *what* otherwise."""
    try:
        return datetime_of_ms(now_ms() + parse_duration_us(text) // 1000)
    except DelayError:
        pass
    at = _iso(text, what)
    if at is None:
        raise DelayError(
            f"{what} {text!r} is neither a duration (10m) nor ISO 8601 (2026-11-21T15:00:00+00:00)"
        )
    return at


def _iso(text: str, what: str) -> datetime | None:
    """ISO 8601, None if it is not; a naive time (read in whose zone?) is refused."""
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if at.tzinfo is None:
        raise DelayError(f"{what} {text!r} has no timezone: add one, e.g. +00:00 or Z")
    return at
