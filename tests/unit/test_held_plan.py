"""Held destinations: delays rounded down to the hold window, never more than it early.

A held destination's consumer waits out the rest, so its plan must skip every digit
below the window, wait no longer than the delay, and at most one window less.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rmqdelay import Settings
from rmqdelay.core.layout import Layout
from rmqdelay.core.plan import plan_delay, plan_route
from rmqdelay.core.topology import build_topology
from rmqdelay.errors import ConfigurationError
from rmqdelay.testing import InMemoryPublisher

LAYOUTS = [
    Layout.build(),
    Layout.build(hold_window_ms=2560),
    Layout.build(radix=10, resolution_ms=1000, hold_window_ms=5000, max_delay_ms=86_400_000),
    Layout.build(radix=2, resolution_ms=10, max_delay_ms=3_600_000),
    Layout.build(radix=10, resolution_ms=1, max_delay_ms=86_400_000, named_tiers_ms=(900_000,)),
    Layout.build(resolution_ms=1000, max_delay_ms=86_400_000),
]


def test_the_default_window_is_the_largest_up_to_six_seconds() -> None:
    assert Layout.build().hold_ms == 5120  # radix 16 at 10 ms: 2 x 16**2 units
    assert Layout.build(radix=2).hold_ms == 5120
    assert Layout.build(radix=10, resolution_ms=1).hold_ms == 5000
    assert Layout.build(resolution_ms=1000).hold_ms == 4000  # 6 s divides no 16: 4 s
    assert Layout.build(resolution_ms=10_000).hold_ms == 10_000  # one unit: never under it


def test_a_window_off_a_digit_boundary_is_refused_naming_the_nearest() -> None:
    with pytest.raises(ConfigurationError, match=r"hold_window 3s must be .*2s560ms or 5s120ms"):
        Layout.build(hold_window_ms=3000)
    # 3 x 16**2 units is a digit, but 3 divides no 16: rounding down to it could borrow
    with pytest.raises(ConfigurationError, match=r"hold_window 7s680ms must be"):
        Layout.build(hold_window_ms=7680)
    assert Layout.build(hold_window_ms=160).hold_units == 16
    assert Layout.build(hold_window_ms=2560).hold_units == 256
    assert Layout.build(hold_window_ms=10_240).hold_units == 4 * 256
    with pytest.raises(ValueError, match="hold_window"):
        Settings(hold_window="1s")


@given(
    layout=st.sampled_from(LAYOUTS),
    delay_us=st.integers(min_value=-(10**6), max_value=3_600 * 10**6),
    now_us=st.integers(min_value=0, max_value=10**15),
)
@example(layout=LAYOUTS[0], delay_us=2_560_000, now_us=0)
@example(layout=LAYOUTS[0], delay_us=2_559_999, now_us=0)
@example(layout=Layout.build(resolution_ms=1000), delay_us=47_000_001, now_us=0)
def test_a_held_plan_is_never_late_and_at_most_one_window_early(
    layout: Layout, delay_us: int, now_us: int
) -> None:
    held = plan_delay(layout, delay_us, "orders", held=True)
    waited_us = held.ttl_ms * 1000
    assert waited_us <= max(0, delay_us)
    assert max(0, delay_us) - waited_us < layout.hold_ms * 1000
    assert held.units % layout.hold_units == 0
    # no more hops than the tiers take for the time it waits in them (rounding the delay
    # up can carry into zeros that rounding it down keeps: 47.000001 s at 1 s, radix 16,
    # is 3 x 16 s up, one hop, and 2 x 16 s + 15 s down, two)
    waits = plan_delay(layout, waited_us, "orders")
    assert len(held.hops) <= len(waits.hops) or layout.named
    route = plan_route(layout, now_us + delay_us, now_us, "orders", held=True)
    assert (route.exchange, route.publish_key, route.routing_key, route.hops) == (
        held.exchange,
        held.publish_key,
        held.routing_key,
        len(held.hops),
    )


def test_held_delays_of_one_to_four_seconds_take_no_hop_and_at_most_one_at_2s560ms() -> None:
    def hops(layout: Layout, held: bool) -> list[int]:
        return [len(plan_delay(layout, ms * 1000, "o", held=held).hops) for ms in range(1000, 4001)]

    full = hops(Layout.build(), held=False)
    assert max(hops(Layout.build(), held=True)) == 0
    narrow = hops(Layout.build(hold_window_ms=2560), held=True)
    assert max(narrow) == 1
    assert sum(narrow) / len(narrow) <= sum(full) / len(full) / 2


@given(delay_us=st.integers(min_value=0, max_value=3_600 * 10**6))
def test_a_wider_window_never_takes_more_hops(delay_us: int) -> None:
    """Rounding down to 2 x 16**2 units changes only the digit at 16**2 (2 divides 16)."""
    wide = plan_delay(Layout.build(), delay_us, "o", held=True)
    narrow = plan_delay(Layout.build(hold_window_ms=2560), delay_us, "o", held=True)
    assert len(wide.hops) <= len(narrow.hops)


def test_a_held_destination_gets_a_marker_and_no_other_does() -> None:
    layout = Layout.build(prefix="held-t")
    topology = build_topology(layout, ["plain"], held=["orders"])
    names = {e.name for e in topology.exchanges}
    assert "held-t.held.orders" in names
    assert "held-t.held.plain" not in names
    assert layout.work_queue("orders") in {q.name for q in topology.queues}


def test_a_publisher_routes_by_the_marker_it_finds() -> None:
    publisher = InMemoryPublisher(held=["orders"])
    held = publisher.publish("orders", b"x", delay="6s")
    plain = publisher.publish("billing", b"x", delay="6s")
    assert held.routing_key.split(".")[-4:] == ["2", "0", "0", "orders"]  # 5.12 s: 0x200
    assert held.hops == 1
    assert plain.hops == 3  # 600 units = 0x258
