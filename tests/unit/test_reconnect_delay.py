"""The worker's reconnect pauses: doubling from 0.5 s, jittered, and never over 15 s."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqdelay.worker.reconnect import RECONNECT_FIRST_S, RECONNECT_MAX_S, reconnect_delay

jitters = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


@given(st.integers(min_value=0, max_value=10**6), jitters)
def test_no_pause_exceeds_the_cap_jitter_included(failures: int, jitter: float) -> None:
    # an hour-long outage is some 240 failures; 10**6 once overflowed 0.5 * 2**failures
    assert 0 < reconnect_delay(failures, jitter) <= RECONNECT_MAX_S


@given(st.integers(min_value=0, max_value=10), jitters)
def test_the_pause_doubles_within_the_jitter_until_the_cap(failures: int, jitter: float) -> None:
    base = RECONNECT_FIRST_S * 2**failures
    assert reconnect_delay(failures, jitter) == min(RECONNECT_MAX_S, base * (0.5 + jitter))


@given(st.integers(min_value=0, max_value=10**6), jitters, jitters)
def test_more_jitter_never_shortens_the_pause(failures: int, a: float, b: float) -> None:
    low, high = sorted((a, b))
    assert reconnect_delay(failures, low) <= reconnect_delay(failures, high)


def test_the_first_pause_is_half_a_second_give_or_take_half() -> None:
    assert reconnect_delay(0, 0.0) == pytest.approx(0.25)
    assert reconnect_delay(0, 0.5) == pytest.approx(RECONNECT_FIRST_S)
    assert reconnect_delay(0, 0.999) < 0.75


def test_the_case_of_the_issue_is_capped() -> None:
    # was min(15, 0.5 * 2**5) * 1.25 = 18.75: the worker logged "retrying in 18.8s"
    assert reconnect_delay(5, 0.75) == RECONNECT_MAX_S
    # the cap is reached, and stays, from the 7th failure whatever the jitter
    assert all(reconnect_delay(n, 0.0) == RECONNECT_MAX_S for n in range(6, 200))
