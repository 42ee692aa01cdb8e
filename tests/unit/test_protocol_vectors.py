"""docs/protocol-vectors.json: the core gives every vector, the bindings carry it, and a
port written from docs/protocol.md alone gives the same.

The file is generated from the core by this module (``python -m
tests.unit.test_protocol_vectors --write``) and checked in: a change to the core that
changes the file changes the wire that other languages' ports follow.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pika
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqdelay import DelayError, InvalidDestinationError, build_topology
from rmqdelay.core.layout import Layout
from rmqdelay.core.plan import DelayPlan
from rmqdelay.core.publishing.publisher import PublisherCore
from tests.helpers import protocol_port
from tests.helpers.topic_routing import walk

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "docs" / "protocol-vectors.json"
PROTOCOL = ROOT / "docs" / "protocol.md"
PROTOCOL_VERSION = 1
NOW_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, the publish instant of every case
REGENERATE = ".venv/bin/python -m tests.unit.test_protocol_vectors --write"

S, MIN, H, D = 1_000, 60_000, 3_600_000, 86_400_000

LAYOUTS: list[tuple[str, dict[str, Any], list[int]]] = [
    # name, settings (Layout.build's), extra delays in ms besides the generic edges
    (
        "default",
        {"prefix": "rmqdelay", "resolution_ms": 10, "radix": 16, "max_delay_ms": 366 * D},
        [1 * S, 2 * S, 3 * S, 4 * S, 5 * S, 8 * S, 15 * MIN, 30 * D],
    ),
    (
        "binary-1s",  # NServiceBus's and Celery's radix, at one second
        {"prefix": "nsb", "resolution_ms": 1000, "radix": 2, "max_delay_ms": H},
        [15 * MIN, 59 * MIN],
    ),
    (
        "named-15m-1h",
        {
            "prefix": "shop",
            "resolution_ms": 10,
            "radix": 16,
            "max_delay_ms": D,
            "named_tiers_ms": [H, 15 * MIN],
        },
        # a named tier exactly, one unit off either way, both named, 15m + 15m, and a
        # tie between the two named tiers (3h10m3s: 1h or 15m, five hops each)
        [
            15 * MIN - 10,
            15 * MIN,
            15 * MIN + 10,
            30 * MIN,
            H,
            H + 15 * MIN,
            3 * H + 10 * MIN + 3 * S,
        ],
    ),
    (
        "decimal-1ms",
        {"prefix": "dec", "resolution_ms": 1, "radix": 10, "max_delay_ms": 10 * S},
        [1234, 9999],
    ),
    (
        "positions-3",  # positions given, so max_delay is what they reach
        {"prefix": "pos", "resolution_ms": 100, "radix": 16, "positions": 3},
        [],
    ),
]


def build(settings: dict[str, Any]) -> Layout:
    options = dict(settings)
    options["named_tiers_ms"] = tuple(options.get("named_tiers_ms", ()))
    return Layout.build(**options)


def edge_delays_us(layout: Layout) -> list[int]:
    """The generic edges: nothing, past, a µs, a unit and just over, a tier exactly and
    one unit over, every low digit at its top, the top tier, max_delay and just over."""
    r, b = layout.resolution_ms * 1000, layout.radix
    top = layout.positions[len(layout.positions) - layout.positional_count]
    limit = layout.max_delay_ms * 1000
    edges = [0, -5_000_000, 1, r, r + 1, b * r, b * r + r, b * b * r - r]
    edges += [top.max_digit * top.weight * r, limit, limit + 1, limit + r]
    return edges


def cases(name: str, layout: Layout, extra_ms: list[int]) -> Iterator[tuple[int, str]]:
    seen: set[int] = set()
    delays = [*edge_delays_us(layout), *(ms * 1000 for ms in extra_ms)]
    for delay in delays:
        if delay in seen or (delay > layout.max_delay_ms * 1000 + layout.resolution_ms * 1000):
            continue
        seen.add(delay)
        yield delay, "orders"
    yield 5 * S * 1000 if layout.max_delay_ms >= 5 * S else 1000, "billing.invoices"
    too_long = "x" * (layout.max_destination_length + 1)
    for bad in ["a..b", "orders\n", "*", too_long]:
        yield 1000, bad


def held_delays_us(layout: Layout, extra_ms: list[int]) -> list[int]:
    """A held destination's edges: under, at and over the hold window and its double,
    a unit, the layout's own delays, max_delay."""
    r, hold = layout.resolution_ms * 1000, layout.hold_ms * 1000
    limit = layout.max_delay_ms * 1000
    delays = [0, -5_000_000, 1, r, hold - r, hold - 1, hold, hold + 1, 2 * hold - 1, 2 * hold]
    delays += [ms * 1000 for ms in extra_ms] + [limit]
    return [d for d in dict.fromkeys(delays) if d <= limit]


def vector_case(
    layout: Layout, delay_us: int, destination: str, *, held: bool = False
) -> dict[str, Any]:
    """One case as the core's publisher makes it: prepared at NOW_MS, routed at once;
    ``held``: to a destination whose held marker exists (§10)."""
    case: dict[str, Any] = {"delay_us": delay_us, "destination": destination}
    core = PublisherCore(layout)
    if held:
        core.held_destinations.add(destination)
    now_us = NOW_MS * 1000
    when: dict[str, Any] = (
        {"delay": timedelta(microseconds=delay_us)}
        if delay_us >= 0
        else {"at": datetime.fromtimestamp((now_us + delay_us) / 10**6, timezone.utc)}
    )
    try:
        prepared = core.prepare(destination, b"", message_id="vector", now=now_us, **when)
    except DelayError as exc:
        assert "max_delay" in str(exc)
        return {**case, "error": "over max_delay"}
    except InvalidDestinationError:
        return {**case, "error": "invalid destination"}
    plan = core.finalize(prepared, now=now_us).plan
    sent = pika.spec.BasicProperties()
    sent.decode(prepared.encoded_properties)
    assert sent.delivery_mode == 2 and sent.message_id == "vector"
    hops = [
        {
            "queue": tier.queue,
            "ttl_ms": tier.ttl_ms,
            "dead_letter_exchange": layout.positions[tier.index].exchange,
        }
        for tier in plan.hops
    ]
    return {
        **case,
        "units": plan.units,
        "digits": list(plan.digits),
        "routing_key": plan.routing_key,
        "exchange": plan.exchange,
        "publish_key": plan.publish_key,
        "hops": hops,
        "work_queue": layout.work_queue(destination),
        "headers": {
            k: int(v) if isinstance(v, int) else v for k, v in (sent.headers or {}).items()
        },
    }


def derived(layout: Layout) -> dict[str, Any]:
    return {
        "max_delay_ms": layout.max_delay_ms,
        "positional_count": layout.positional_count,
        "capacity_units": layout.capacity_units,
        "delivery_exchange": layout.delivery_exchange,
        "hold_ms": layout.hold_ms,
        "positions": [
            {
                "label": p.label,
                "weight": p.weight,
                "max_digit": p.max_digit,
                "hop_exchange": p.exchange,
                "tiers": [
                    {"digit": t.digit, "queue": t.queue, "ttl_ms": t.ttl_ms} for t in p.tiers
                ],
            }
            for p in layout.positions
        ],
    }


def example() -> dict[str, Any]:
    """One whole message and its journal record, as docs/protocol.md §4 and §6 show it."""
    layout = build(LAYOUTS[0][1])
    core = PublisherCore(layout)
    message_id = "3f0c1a52-9d1e-4b7a-8c3e-2a9f6b1d0e47"
    prepared = core.prepare(
        "orders", {"order_id": 42}, delay="5s", now=NOW_MS * 1000, message_id=message_id
    )
    out = core.finalize(prepared, now=NOW_MS * 1000)
    sent = pika.spec.BasicProperties()
    sent.decode(prepared.encoded_properties)
    properties = {k: v for k, v in vars(sent).items() if v is not None}
    properties["headers"] = {
        k: int(v) if isinstance(v, int) else v for k, v in (sent.headers or {}).items()
    }
    journal = core.journal_write([prepared], now_ms=NOW_MS)
    return {
        "layout": "default",
        "delay_us": 5_000_000,
        "destination": "orders",
        "exchange": out.exchange,
        "routing_key": out.routing_key,
        "body": prepared.body.decode(),
        "properties": properties,
        "journal": {
            "exchange": f"{layout.prefix}.schedule",
            "properties": {k: v for k, v in journal.properties.items() if k != "message_id"},
            "body": journal.body.decode(),
        },
    }


def generate() -> dict[str, Any]:
    layouts = []
    for name, settings, extra in LAYOUTS:
        layout = build(settings)
        full = {
            "prefix": layout.prefix,
            "resolution_ms": layout.resolution_ms,
            "radix": layout.radix,
            "max_delay_ms": settings.get("max_delay_ms"),
            "positions": settings.get("positions"),
            "named_tiers_ms": list(settings.get("named_tiers_ms", [])),
            "max_destination_length": layout.max_destination_length,
        }
        layouts.append(
            {
                "name": name,
                "settings": full,
                "derived": derived(layout),
                "cases": [vector_case(layout, d, dest) for d, dest in cases(name, layout, extra)],
                "held_cases": [
                    vector_case(layout, d, "orders", held=True)
                    for d in held_delays_us(layout, extra)
                ],
            }
        )
    return {
        "protocol_version": PROTOCOL_VERSION,
        "about": (
            "Test vectors of rmqdelay's wire protocol: see docs/protocol.md, section 9. "
            f"Generated from rmqdelay's core by `{REGENERATE}`."
        ),
        "now_ms": NOW_MS,
        "example": example(),
        "layouts": layouts,
    }


def render(value: Any, indent: int = 0, key: str = "") -> str:
    """JSON with one tier and one case to a line: readable, and diffs show cases."""
    pad = "  " * indent
    if isinstance(value, dict) and value:
        items = [
            f"{pad}  {json.dumps(k)}: {render(v, indent + 1, k).lstrip()}" for k, v in value.items()
        ]
        return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
    tall = ("tiers", "cases", "held_cases", "positions", "layouts")
    if isinstance(value, list) and value and key in tall:
        inner = [
            render(v, indent + 1)
            if key in ("positions", "layouts")
            else pad + "  " + json.dumps(v, ensure_ascii=False)
            for v in value
        ]
        return pad + "[\n" + ",\n".join(inner) + "\n" + pad + "]"
    return pad + json.dumps(value, ensure_ascii=False)


def write() -> None:
    VECTORS.write_text(render(generate()) + "\n", encoding="utf-8")


def load() -> dict[str, Any]:
    return json.loads(VECTORS.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def all_cases(kind: str = "cases") -> list[tuple[dict[str, Any], dict[str, Any]]]:
    if not VECTORS.exists():  # so that --write can make it; the tests below then fail
        return []
    return [(layout, case) for layout in load()["layouts"] for case in layout.get(kind, [])]


def _case_id(pair: tuple[dict[str, Any], dict[str, Any]]) -> str:
    layout, case = pair
    return f"{layout['name']}:{case['delay_us']}us:{case['destination'][:12]!r}"


# --------------------------------------------------------------------------- the core


def test_the_vectors_are_what_the_core_gives() -> None:
    """Fails when the core and the checked-in file disagree: the wire changed."""
    expected, found = generate(), load()
    if expected == found:
        return
    differences = []
    for mine, theirs in zip(expected["layouts"], found["layouts"], strict=False):
        for kind in ("cases", "held_cases"):
            for a, b in zip(mine[kind], theirs.get(kind, []), strict=False):
                if a != b:
                    differences.append(f"{mine['name']} {kind}: core {a}\n  file {b}")
        if mine["derived"] != theirs["derived"]:
            differences.append(f"{mine['name']}: the derived layout differs")
    if {k: v for k, v in expected.items() if k != "layouts"} != {
        k: v for k, v in found.items() if k != "layouts"
    }:
        differences.append("the header or the example differs")
    pytest.fail(
        "docs/protocol-vectors.json and rmqdelay's core disagree:\n"
        + "\n".join(differences[:10] or ["the layouts or their cases differ in number"])
        + "\nIf the wire is meant to change, say so in docs/protocol.md (and raise "
        f"PROTOCOL_VERSION when ports would break), then regenerate: {REGENERATE}",
        pytrace=False,
    )


def test_the_vectors_cover_the_edges() -> None:
    """The cases the brief asks for are there, in each layout."""
    for layout in load()["layouts"]:
        settings, cases_ = layout["settings"], layout["cases"]
        r_us = settings["resolution_ms"] * 1000
        limit = layout["derived"]["max_delay_ms"] * 1000
        by_delay = {c["delay_us"]: c for c in cases_ if c["destination"] == "orders"}
        assert by_delay[0]["hops"] == [] and by_delay[0]["exchange"] == ""
        assert by_delay[1]["units"] == 1 and by_delay[r_us + 1]["units"] == 2
        assert by_delay[limit]["hops"], layout["name"]
        assert by_delay[limit + 1]["error"] == "over max_delay"
        errors = {c["destination"]: c.get("error") for c in cases_}
        assert errors["orders\n"] == errors["a..b"] == "invalid destination"
        assert any(len(c["hops"]) > 2 for c in cases_ if "hops" in c)
        # held (§10): never late, never earlier than the window; never more hops but
        # with named tiers (15 min is no multiple of 5.12 s: held, it takes 3 hops)
        hold_us = layout["derived"]["hold_ms"] * 1000
        named = bool(settings["named_tiers_ms"])
        for case in layout["held_cases"]:
            waited, d = case["units"] * r_us, max(0, case["delay_us"])
            assert waited <= d < waited + hold_us, (layout["name"], case)
            assert case["units"] % (hold_us // r_us) == 0
            plain = by_delay.get(case["delay_us"])
            if plain is not None and "hops" in plain and not named:
                assert len(case["hops"]) <= len(plain["hops"])
        assert any(c["hops"] for c in layout["held_cases"])


@pytest.mark.parametrize("name", [name for name, _, _ in LAYOUTS])
def test_each_case_walks_the_declared_bindings(name: str) -> None:
    """The topology the core declares (as data) carries every case through exactly its
    hops, each dead-lettering where the vector says, to its work queue."""
    (layout_json,) = [entry for entry in load()["layouts"] if entry["name"] == name]
    layout = build({k: v for k, v in layout_json["settings"].items() if v is not None})
    planned = [c for c in layout_json["cases"] + layout_json["held_cases"] if "error" not in c]
    topology = build_topology(layout, {c["destination"] for c in planned})
    declared = {q.name: q.arguments for q in topology.queues if q.role == "tier"}
    listed = {
        t["queue"]: t["ttl_ms"] for p in layout_json["derived"]["positions"] for t in p["tiers"]
    }
    assert {q: args["x-message-ttl"] for q, args in declared.items()} == listed
    for case in planned:
        # the vector's own exchange and keys, walked through the bindings
        plan = DelayPlan(
            case["units"],
            tuple(case["digits"]),
            (),
            case["destination"],
            case["routing_key"],
            case["exchange"],
            case["publish_key"],
        )
        tiers, end = walk(topology, plan)
        assert tiers == [hop["queue"] for hop in case["hops"]]
        assert end == case["work_queue"]
        for hop in case["hops"]:
            assert declared[hop["queue"]]["x-dead-letter-exchange"] == hop["dead_letter_exchange"]
        assert case["exchange"] == (case["hops"][0]["queue"] if case["hops"] else "")


def test_the_protocol_page_shows_the_vectors() -> None:
    """docs/protocol.md's worked example and journal line are the vectors' own."""
    text = PROTOCOL.read_text(encoding="utf-8")
    data = load()
    default = data["layouts"][0]
    five = next(
        c for c in default["cases"] if (c["delay_us"], c["destination"]) == (5_000_000, "orders")
    )
    assert f"routing key `{five['routing_key']}`" in text
    assert f"Publish to exchange `{five['exchange']}`" in text
    for hop in five["hops"]:
        assert f"`{hop['queue']}` ({hop['ttl_ms']} ms)" in text
    assert f"`{data['example']['journal']['body']}`" in text
    tiers = sorted(
        (t for p in default["derived"]["positions"] for t in p["tiers"]), key=lambda t: t["ttl_ms"]
    )
    shown = f"{len(tiers)} tiers, from `{tiers[0]['queue']}` to `{tiers[-1]['queue']}`"
    assert shown in " ".join(text.split())
    held = next(c for c in default["held_cases"] if c["delay_us"] == 8_000_000)
    words = " ".join(text.split())
    assert f"8 s plans {held['units']} units" in words
    assert f"routing key `{held['routing_key']}`" in words
    assert f"one hop, `{held['hops'][0]['queue']}`" in words
    assert f"= {default['derived']['hold_ms']:,} ms" in words


# --------------------------------------------------------------------------- a port


@pytest.mark.parametrize("pair", all_cases(), ids=_case_id)
def test_a_port_from_the_page_gives_every_case(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    layout_json, case = pair
    port = protocol_port.PortLayout.of(layout_json["settings"])
    try:
        planned = port.plan(case["delay_us"], case["destination"])
    except protocol_port.PortError as exc:
        assert case.get("error") == str(exc)
        return
    assert "error" not in case, case
    due = protocol_port.due_ms(NOW_MS * 1000, case["delay_us"])
    got = {**planned, "headers": protocol_port.headers(due, case["destination"])}
    assert got == {k: v for k, v in case.items() if k not in ("delay_us", "destination")}


@pytest.mark.parametrize("pair", all_cases("held_cases"), ids=_case_id)
def test_a_port_from_the_page_gives_every_held_case(
    pair: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    layout_json, case = pair
    port = protocol_port.PortLayout.of(layout_json["settings"])
    planned = port.plan(case["delay_us"], case["destination"], held=True)
    due = protocol_port.due_ms(NOW_MS * 1000, case["delay_us"])
    got = {**planned, "headers": protocol_port.headers(due, case["destination"])}
    assert got == {k: v for k, v in case.items() if k not in ("delay_us", "destination")}


def test_a_port_from_the_page_derives_every_layout() -> None:
    for layout_json in load()["layouts"]:
        port = protocol_port.PortLayout.of(layout_json["settings"])
        want = layout_json["derived"]
        assert port.words == want["positions"]
        assert (port.max_delay, port.p, port.capacity, port.hold_ms) == (
            want["max_delay_ms"],
            want["positional_count"],
            want["capacity_units"],
            want["hold_ms"],
        )


def test_a_port_reads_the_layout_from_the_tier_queues() -> None:
    """§1's reading from the broker, on the names and TTLs the core declares."""
    for layout_json in load()["layouts"]:
        settings = layout_json["settings"]
        layout = build({k: v for k, v in settings.items() if v is not None})
        tiers = [
            (q.name, q.arguments["x-message-ttl"])
            for q in build_topology(layout).queues
            if q.role == "tier"
        ]
        read = protocol_port.layout_from_queues(settings["prefix"], tiers)
        assert read == {
            "resolution_ms": layout.resolution_ms,
            "radix": layout.radix,
            "positions": layout.positional_count,
            "top": layout.positions[len(layout.named)].max_digit,
            "named_tiers_ms": settings["named_tiers_ms"],
        }


def test_a_port_writes_the_example_journal_record() -> None:
    example_json = load()["example"]
    headers = example_json["properties"]["headers"]
    line = protocol_port.journal_line(
        example_json["properties"]["message_id"],
        example_json["destination"],
        headers["rmqdelay-due-at"],
        len(example_json["body"].encode()),
        NOW_MS,
    )
    assert line.decode() == example_json["journal"]["body"]
    assert headers == protocol_port.headers(
        protocol_port.due_ms(NOW_MS * 1000, example_json["delay_us"]), "orders"
    )


@st.composite
def port_settings(draw: st.DrawFn) -> dict[str, Any]:
    r = draw(st.sampled_from([1, 5, 10, 100, 1000]))
    settings: dict[str, Any] = {
        "prefix": "p",
        "resolution_ms": r,
        "radix": draw(st.integers(2, 16)),
    }
    if draw(st.booleans()):
        settings["max_delay_ms"] = draw(st.integers(1, 400 * D))
    else:
        settings["positions"] = draw(st.integers(1, 6))
        settings["max_delay_ms"] = None
    named = draw(st.lists(st.integers(1, 10**6), max_size=3, unique=True))
    limit = settings["max_delay_ms"] or (settings["radix"] ** settings["positions"] - 1) * r
    settings["named_tiers_ms"] = sorted((n * r for n in named if n * r <= limit), reverse=True)
    return settings


@given(port_settings(), st.data())
def test_a_port_from_the_page_agrees_with_the_core_anywhere(
    settings: dict[str, Any], data: st.DataObject
) -> None:
    layout = build({k: v for k, v in settings.items() if v is not None})
    port = protocol_port.PortLayout.of(settings)
    assert port.words == derived(layout)["positions"]
    assert port.hold_ms == layout.hold_ms
    for _ in range(5):
        delay = data.draw(st.integers(-(10**6), layout.max_delay_ms * 1000 + 10**5))
        held = data.draw(st.booleans())
        case = vector_case(layout, delay, "d", held=held)
        try:
            planned = port.plan(delay, "d", held=held)
        except protocol_port.PortError as exc:
            assert case.get("error") == str(exc)
            continue
        assert {**planned, "headers": case["headers"]} == {
            k: v for k, v in case.items() if k not in ("delay_us", "destination")
        }


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {REGENERATE}")
    write()
    print(f"wrote {VECTORS.relative_to(ROOT)}")
