"""Plan a delay: round it up to whole units, write it in digits, list the tiers it visits.

Pure: the same layout and delay always give the same plan, and no plan is early,
because the units are rounded up and the tiers' TTLs add up to exactly those units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..errors import DelayError
from .clock import ms_of_us, us_of_ms
from .durations import format_ms
from .frozen import make
from .layout import DIGITS, Layout, Tier

__all__ = ["DelayPlan", "Route", "check_max_delay", "digits_for", "plan_delay", "plan_route"]


@dataclass(frozen=True)
class DelayPlan:
    """Where to publish a message so that it reaches ``destination`` after ``units``."""

    units: int
    digits: tuple[int, ...]
    hops: tuple[Tier, ...]
    destination: str
    routing_key: str
    exchange: str
    publish_key: str

    @property
    def ttl_ms(self) -> int:
        return sum(t.ttl_ms for t in self.hops)


def _positional(layout: Layout, rest: int) -> list[int]:
    digits = []
    for weight in _weights(layout):
        digit, rest = divmod(rest, weight)
        digits.append(digit)
    return digits


def _weights(layout: Layout) -> tuple[int, ...]:
    """The positional weights, most significant first: kept on the layout, which is
    immutable, since every publish plans with them."""
    try:
        return layout.__dict__["_plan_weights"]  # type: ignore[no-any-return]
    except KeyError:
        positional = layout.positions[len(layout.positions) - layout.positional_count :]
        weights = tuple(p.weight for p in positional)
        object.__setattr__(layout, "_plan_weights", weights)
        return weights


def digits_for(layout: Layout, units: int) -> tuple[int, ...]:
    """The digits of ``units``, one per position, using named tiers where they save hops."""
    named = layout.named
    if not named and 0 <= units <= layout.capacity_units:
        return tuple(_positional(layout, units))
    best: tuple[int, ...] | None = None
    best_cost = (0, 0)
    for mask in range(1 << len(named)):
        used = [(mask >> i) & 1 for i in range(len(named))]
        rest = units - sum(w * p.weight for w, p in zip(used, named, strict=True))
        if rest < 0 or rest > layout.capacity_units:
            continue
        digits = (*used, *_positional(layout, rest))
        cost = (sum(1 for d in digits if d), sum(used))
        if best is None or cost < best_cost:
            best, best_cost = digits, cost
    if best is None:
        raise DelayError(
            f"{units} units of {format_ms(layout.resolution_ms)} do not fit the layout's "
            f"{layout.capacity_units} units"
        )
    return best


_CENTURY_US = 100 * 366 * 24 * 3600 * 10**6


def check_max_delay(layout: Layout, delay_us: int) -> None:
    if delay_us > us_of_ms(layout.max_delay_ms):
        # a delay past a century is shown as such, not as a number of 140 digits
        shown = format_ms(ms_of_us(delay_us)) if delay_us < _CENTURY_US else "over a century"
        raise DelayError(
            f"delay of {shown} is over the maximum of "
            f"{format_ms(layout.max_delay_ms)}; raise max_delay in the settings"
        )


def plan_delay(layout: Layout, delay_us: int, destination: str, *, held: bool = False) -> DelayPlan:
    """Plan a delay of ``delay_us`` microseconds; zero or less goes straight to delivery.

    ``destination`` must already be validated (see ``routing.validate_destination``).
    ``held``: its consumers are rmqdelay's, which wait out the last stretch, so the
    delay is rounded *down* to the hold window and the digits below it cost no hop.
    """
    max_us, unit_us, positional, capacity = _bounds(layout)
    if delay_us > max_us:
        check_max_delay(layout, delay_us)
    units = _units(layout, delay_us, unit_us, held)
    hops: list[Tier] = []
    if positional and units <= capacity:  # no named tier: digits_for's usual case
        digits = []
        words = []
        rest = units
        for weight, tiers in positional:
            digit, rest = divmod(rest, weight)
            digits.append(digit)
            words.append(DIGITS[digit])
            if digit:
                hops.append(tiers[digit - 1])
        words.append(destination)
        key = ".".join(words)
    else:
        digits = list(digits_for(layout, units))
        hops = [p.tiers[d - 1] for p, d in zip(layout.positions, digits, strict=True) if d]
        key = ".".join([*[DIGITS[d] for d in digits], destination])
    if hops:
        exchange, publish_key = hops[0].queue, key  # the first tier's own fanout
    else:  # straight to the work queue, so a missing queue comes back as a return
        exchange, publish_key = "", layout.work_queue(destination)
    return make(
        DelayPlan,
        {
            "units": units,
            "digits": tuple(digits),
            "hops": tuple(hops),
            "destination": destination,
            "routing_key": key,
            "exchange": exchange,
            "publish_key": publish_key,
        },
    )


class Route(NamedTuple):
    """What sending a message and its result need of its :class:`DelayPlan`, planned at
    ``planned_at_us``: ``plan_delay(layout, due - planned_at_us, destination)`` gives
    the whole plan again, the same one."""

    exchange: str
    publish_key: str
    routing_key: str
    hops: int
    planned_at_us: int


_route = tuple.__new__
_FORMATS = {2: "b", 8: "o", 16: "x"}
"""Radixes whose digits ``format`` writes as the words of :data:`DIGITS`."""


def _units(layout: Layout, delay_us: int, unit_us: int, held: bool) -> int:
    """Units up (never early), or for a held destination down to the hold window."""
    if delay_us <= 0:
        return 0
    if held:
        window_us = unit_us * layout.hold_units
        return delay_us // window_us * layout.hold_units
    return -(-delay_us // unit_us)


def plan_route(
    layout: Layout, due_us: int, now_us: int, destination: str, *, held: bool = False
) -> Route:
    """:func:`plan_delay` of the delay left at ``now_us`` until ``due_us``, cut to what
    the wire and the result need: the async publisher routes each message of a batch
    with this, and keeps no :class:`DelayPlan` (four objects the garbage collector
    walked for every message in flight; ``tests/unit/test_fast_paths.py`` checks the
    two agree)."""
    delay_us = due_us - now_us
    max_us, unit_us, positional, capacity = bounds = _bounds(layout)
    if held:
        units = _units(layout, delay_us, unit_us, held)
    else:
        units = -(-delay_us // unit_us)
        if units < 0:
            units = 0
    if not positional or units > capacity or delay_us > max_us:
        plan = plan_delay(layout, delay_us, destination, held=held)
        return _route(
            Route, (plan.exchange, plan.publish_key, plan.routing_key, len(plan.hops), now_us)
        )
    kind, width, radix = _formats(layout, bounds)
    if kind:  # the digits in C: one character per position
        written = format(units, kind).rjust(width, "0")
        key = ".".join(written) + "." + destination
        significant = written.lstrip("0")
        if not significant:
            return _route(Route, ("", layout.work_queue(destination), key, 0, now_us))
        hops = len(significant) - significant.count("0")
        queue = positional[width - len(significant)][1][int(significant[0], radix) - 1].queue
        return _route(Route, (queue, key, key, hops, now_us))
    words = []
    queue = ""
    hops = 0
    rest = units
    for weight, tiers in positional:
        digit, rest = divmod(rest, weight)
        words.append(DIGITS[digit])
        if digit:
            if not hops:
                queue = tiers[digit - 1].queue
            hops += 1
    words.append(destination)
    key = ".".join(words)
    if not hops:
        return _route(Route, ("", layout.work_queue(destination), key, 0, now_us))
    return _route(Route, (queue, key, key, hops, now_us))


_Bounds = tuple[int, int, tuple[tuple[int, tuple[Tier, ...]], ...], int]


def _formats(layout: Layout, bounds: _Bounds) -> tuple[str, int, int]:
    """``format``'s letter for the layout's radix (empty when it has none), the number of
    positional digits and the radix, kept on the layout as :func:`_bounds` is."""
    try:
        return layout.__dict__["_route_formats"]  # type: ignore[no-any-return]
    except KeyError:
        formats = (_FORMATS.get(layout.radix, ""), len(bounds[2]), layout.radix)
        object.__setattr__(layout, "_route_formats", formats)
        return formats


def _bounds(layout: Layout) -> _Bounds:
    """What every plan reads of the layout, kept on it (it is immutable): the most µs,
    the µs per unit, each position's weight and tiers when every position is positional
    (else empty), and the units the positional digits can write."""
    try:
        return layout.__dict__["_plan_bounds"]  # type: ignore[no-any-return]
    except KeyError:
        positional = (
            tuple((p.weight, p.tiers) for p in layout.positions)
            if layout.positional_count == len(layout.positions)
            else ()
        )
        bounds = (
            us_of_ms(layout.max_delay_ms),
            us_of_ms(layout.resolution_ms),
            positional,
            layout.capacity_units,
        )
        object.__setattr__(layout, "_plan_bounds", bounds)
        return bounds
