"""One home for time.

The wire and the journal carry Unix milliseconds (due times, records) and the planner
works in microseconds; users see aware UTC datetimes and seconds. Every conversion
between them lives here, so a rounding rule is written once.
"""

from __future__ import annotations

import calendar
import time
from datetime import datetime, timedelta, timezone

__all__ = [
    "as_utc",
    "datetime_of_ms",
    "datetime_of_us",
    "iso_of_ms",
    "ms_of_datetime",
    "ms_of_timedelta",
    "ms_of_us",
    "now_ms",
    "now_us",
    "seconds_of_datetime",
    "seconds_of_ms",
    "timedelta_of_ms",
    "timedelta_of_us",
    "us_of_datetime",
    "us_of_ms",
    "us_of_timedelta",
]


def now_us() -> int:
    """Unix time in µs: what the planner starts a delay from."""
    return time.time_ns() // 1000


def now_ms() -> int:
    """Unix time in ms: the unit of due times and journal records."""
    return time.time_ns() // 1_000_000


def datetime_of_ms(ms: int) -> datetime:
    """An aware UTC datetime for Unix ``ms``."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def datetime_of_us(us: int) -> datetime:
    """An aware UTC datetime for Unix ``us``, exact (no float on the way): the x-delay
    bridge's due times, from when a delivery arrived."""
    return _EPOCH + timedelta(microseconds=us)


def iso_of_ms(ms: int, timespec: str = "milliseconds") -> str:
    """ISO 8601 in UTC, as the CLI prints due and parked times."""
    return datetime_of_ms(ms).isoformat(timespec=timespec)


def ms_of_datetime(at: datetime) -> int:
    """Unix ms of an aware datetime, rounded to the nearest ms."""
    return round(at.timestamp() * 1000)


def ms_of_us(us: int) -> int:
    """Unix ms of a time in µs, rounded up: a message is never due before the time asked."""
    return -(-us // 1000)


def us_of_ms(ms: int) -> int:
    return ms * 1000


def us_of_datetime(at: datetime) -> float:
    """Unix µs of a datetime, unrounded (the planner rounds a due time up, not to nearest)."""
    return at.timestamp() * 1_000_000


def timedelta_of_ms(ms: float) -> timedelta:
    return timedelta(milliseconds=ms)


def seconds_of_ms(ms: float) -> float:
    return ms / 1000


def as_utc(at: datetime) -> datetime:
    """A naive datetime taken as UTC: what the AMQP libraries mean by one."""
    return at if at.tzinfo is not None else at.replace(tzinfo=timezone.utc)


def seconds_of_datetime(at: datetime) -> int:
    """Whole Unix seconds (an AMQP timestamp), a fraction dropped; naive is UTC."""
    return calendar.timegm(as_utc(at).utctimetuple())


def timedelta_of_us(us: int) -> timedelta:
    return timedelta(microseconds=us)


def ms_of_timedelta(span: timedelta) -> int:
    """A span in whole ms, rounded to the nearest (a lateness in logs and metrics)."""
    return round(span / timedelta(milliseconds=1))


def us_of_timedelta(span: timedelta) -> int:
    """A span in µs, exactly (a timedelta holds whole µs)."""
    return span // timedelta(microseconds=1)
