"""The one home for time: each conversion's rounding, and the round trips between units."""

from __future__ import annotations

import math
import time
from datetime import datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from rmqdelay.core import clock

# from 1970 to 9999: what an aware datetime can hold and a due time can be
MS = st.integers(min_value=0, max_value=253_402_300_799_999)
US = st.integers(min_value=0, max_value=253_402_300_799_999_999)
SPANS_MS = st.integers(min_value=-(10**12), max_value=10**12)


@given(MS)
def test_ms_round_trip_through_a_datetime(ms: int) -> None:
    at = clock.datetime_of_ms(ms)
    assert at.tzinfo is timezone.utc
    assert clock.ms_of_datetime(at) == ms


@given(US)
def test_us_to_ms_rounds_up_never_early(us: int) -> None:
    ms = clock.ms_of_us(us)
    assert ms * 1000 >= us > (ms - 1) * 1000


@given(MS)
def test_whole_ms_in_us_stay_whole(ms: int) -> None:
    assert clock.ms_of_us(clock.us_of_ms(ms)) == ms


@given(SPANS_MS)
def test_a_span_round_trips_through_timedelta(ms: int) -> None:
    assert clock.ms_of_timedelta(clock.timedelta_of_ms(ms)) == ms
    assert clock.seconds_of_ms(ms) == clock.timedelta_of_ms(ms).total_seconds()


@given(st.integers(min_value=-(10**15), max_value=10**15))
def test_a_span_in_us_round_trips_through_timedelta(us: int) -> None:
    assert clock.us_of_timedelta(clock.timedelta_of_us(us)) == us


def test_a_timedelta_rounds_to_the_nearest_ms() -> None:
    assert clock.ms_of_timedelta(timedelta(microseconds=1499)) == 1
    assert clock.ms_of_timedelta(timedelta(microseconds=1501)) == 2
    assert clock.ms_of_timedelta(timedelta(microseconds=-1501)) == -2


def test_a_datetime_rounds_to_the_nearest_ms() -> None:
    at = datetime(2030, 1, 1, tzinfo=timezone.utc)
    base = clock.ms_of_datetime(at)
    assert clock.ms_of_datetime(at + timedelta(microseconds=400)) == base
    assert clock.ms_of_datetime(at + timedelta(microseconds=600)) == base + 1


def test_an_offset_datetime_is_the_same_instant() -> None:
    plus_two = timezone(timedelta(hours=2))
    at = datetime(2030, 1, 1, 2, 0, tzinfo=plus_two)
    assert clock.ms_of_datetime(at) == clock.ms_of_datetime(at.astimezone(timezone.utc))
    assert clock.us_of_datetime(at) == 1_893_456_000_000_000


def test_iso_is_utc_at_the_asked_precision() -> None:
    assert clock.iso_of_ms(1_893_456_000_123) == "2030-01-01T00:00:00.123+00:00"
    assert clock.iso_of_ms(1_893_456_000_123, "seconds") == "2030-01-01T00:00:00+00:00"


def test_now_agrees_with_the_system_clock() -> None:
    before = time.time_ns()
    us, ms = clock.now_us(), clock.now_ms()
    after = time.time_ns()
    assert before // 1000 <= us <= after // 1000
    assert before // 10**6 <= ms <= after // 10**6


@given(st.integers(min_value=0, max_value=4_102_444_800 * 10**6))  # to 2100
def test_a_time_in_us_through_a_datetime_is_never_earlier(us: int) -> None:
    """The x-delay bridge's due times: ``at=`` a datetime built from µs; the planner reads
    it back (a float) and rounds up."""
    at = clock.datetime_of_us(us)
    assert at.tzinfo is not None
    assert math.ceil(clock.us_of_datetime(at)) in (us, us + 1)
