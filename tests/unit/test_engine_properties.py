"""Property tests of the pure engine: planning, routing keys and topology as data."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rmqdelay import Settings, build_topology, plan_delay
from rmqdelay.core.layout import MAX_TTL_MS
from rmqdelay.core.routing import parse_key
from tests.helpers.topic_routing import route, walk


@st.composite
def layouts(draw: st.DrawFn) -> Settings:
    resolution = draw(st.sampled_from([1, 5, 10, 100, 1000]))
    radix = draw(st.integers(2, 16))
    max_delay = draw(st.integers(1, 400 * 86_400_000))
    named = draw(
        st.lists(st.integers(1, 10**6).map(lambda n: n * resolution), max_size=2, unique=True)
    )
    return Settings(
        resolution=f"{resolution}ms",
        radix=radix,
        max_delay=f"{max_delay}ms",
        named_tiers=[f"{n}ms" for n in named if n <= max_delay],
        queue_type=draw(st.sampled_from(["quorum", "classic"])),
        max_destination_length=60,
    )


destinations = st.from_regex(r"[a-z0-9_-]{1,8}(\.[a-z0-9_-]{1,8}){0,2}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(layouts(), st.data())
def test_plan_sums_to_rounded_delay_and_is_never_early(
    config: Settings, data: st.DataObject
) -> None:
    layout = config.layout
    delay_us = data.draw(st.integers(0, layout.max_delay_ms * 1000))
    plan = plan_delay(layout, delay_us, "orders")
    step_us = layout.resolution_ms * 1000
    assert plan.units == -(-delay_us // step_us)
    assert plan.ttl_ms == plan.units * layout.resolution_ms
    assert plan.ttl_ms * 1000 >= delay_us
    assert sum(t.units for t in plan.hops) == plan.units


@settings(max_examples=300, deadline=None)
@given(layouts(), st.data())
def test_hops_are_nonzero_digits_or_fewer_with_named_tiers(
    config: Settings, data: st.DataObject
) -> None:
    layout = config.layout
    delay_us = data.draw(st.integers(0, layout.max_delay_ms * 1000))
    plan = plan_delay(layout, delay_us, "d")
    assert len(plan.hops) == sum(1 for d in plan.digits if d)
    plain, rest = 0, plan.units
    while rest:
        rest, digit = divmod(rest, layout.radix)
        plain += digit != 0
    if layout.named:
        assert len(plan.hops) <= plain
    else:
        assert len(plan.hops) == plain
    assert [t.index for t in plan.hops] == sorted(t.index for t in plan.hops)


@settings(max_examples=300, deadline=None)
@given(layouts(), destinations, st.data())
def test_routing_key_parses_back(config: Settings, destination: str, data: st.DataObject) -> None:
    layout = config.layout
    plan = plan_delay(layout, data.draw(st.integers(0, layout.max_delay_ms * 1000)), destination)
    parsed = parse_key(layout, plan.routing_key)
    assert parsed.digits == plan.digits
    assert parsed.destination == destination
    assert len(plan.routing_key.encode()) <= 255


@settings(max_examples=150, deadline=None)
@given(layouts(), st.lists(destinations, min_size=1, max_size=3, unique=True), st.data())
def test_bindings_route_every_key_through_exactly_its_tiers(
    config: Settings, names: list[str], data: st.DataObject
) -> None:
    layout = config.layout
    topology = build_topology(config.layout, names)
    for _ in range(5):
        destination = data.draw(st.sampled_from(names))
        delay_us = data.draw(st.integers(0, layout.max_delay_ms * 1000))
        plan = plan_delay(layout, delay_us, destination)
        tiers, end = walk(topology, plan)
        assert tiers == [t.queue for t in plan.hops]
        assert end == layout.work_queue(destination)


@settings(max_examples=100, deadline=None)
@given(layouts(), st.data())
def test_unknown_destination_ends_in_parking_through_the_alternate_exchange(
    config: Settings, data: st.DataObject
) -> None:
    layout = config.layout
    topology = build_topology(config.layout, ["known"])
    delay_us = data.draw(st.integers(1, layout.max_delay_ms * 1000))
    plan = plan_delay(layout, delay_us, "gone")
    *_, last = plan.hops
    delivered = route(
        topology, topology.queue(last.queue).arguments["x-dead-letter-exchange"], plan.routing_key
    )
    assert delivered == []  # unroutable at the delivery exchange...
    delivery = next(e for e in topology.exchanges if e.name == layout.delivery_exchange)
    assert route(topology, delivery.arguments["alternate-exchange"], plan.routing_key) == [
        layout.parking
    ]  # ...so the alternate exchange parks it


def test_topology_arguments_for_quorum() -> None:
    config = Settings(max_delay="1h", delivery_limit=7)
    layout = config.layout
    topology = build_topology(config.layout, ["orders"])
    for queue in topology.queues:
        if queue.role in ("journal", "checkpoints"):  # streams, by design; kept by size
            assert queue.arguments == {
                "x-queue-type": "stream",
                "x-max-length-bytes": 2 * 1024**3,
                "x-stream-max-segment-size-bytes": 2 * 1024**3 // 8,
            }
            continue
        assert queue.arguments["x-queue-type"] == "quorum"
        if queue.role in ("tier", "work"):
            assert queue.arguments["x-dead-letter-strategy"] == "at-least-once"
            assert queue.arguments["x-overflow"] == "reject-publish"
    work = topology.queue(layout.work_queue("orders"))
    assert work.arguments["x-delivery-limit"] == 7
    assert work.arguments["x-dead-letter-exchange"] == layout.parking
    assert "rmqdelay.tier.p2.3-7s680ms" in {q.name for q in topology.queues}
    # 1h = 360,000 units of 10 ms: five positions, the top one needing digits 1 to 5 only
    assert [p.max_digit for p in layout.positions] == [5, 15, 15, 15, 15]
    assert len([q for q in topology.queues if q.role == "tier"]) == 5 + 4 * 15
    assert [q.name for q in topology.queues if q.role == "journal"] == ["rmqdelay.schedule"]
    assert [q.name for q in topology.queues if q.role == "checkpoints"] == [
        "rmqdelay.schedule.checkpoints"
    ]
    without = build_topology(config.replace(schedule_journal=False).layout, [])
    assert not [q for q in without.queues if q.role in ("journal", "checkpoints")]


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_every_tier_is_reachable_and_within_the_ttl_cap(config: Settings) -> None:
    layout = config.layout
    assert layout.capacity_units * layout.resolution_ms >= layout.max_delay_ms
    for tier in layout.tiers:
        assert 0 < tier.ttl_ms <= MAX_TTL_MS
        assert tier.units <= -(-layout.max_delay_ms // layout.resolution_ms)
