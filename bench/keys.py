"""Every figure the README shows, under a short stable key, from the workloads' JSON files.

``python -m bench report`` writes them to ``bench/results/figures.json``.
A figure is ``{"value": ..., "unit": ..., "ratio": ..., "to": <reference key>, ...}``
(``text`` for words). The workloads keep their whole detail in their own JSON files; this
module is the one place that knows those files' shapes, and ``bench.report`` reads only
``figures.json``. Keys name the workload first: ``publish.sync.many.long``,
``e2e.r500.p99``, ``peers.naive.publish``, ``radix.r16.hops``, ``scale.drain.rate``.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
WORKLOADS = (  # the suite runs them in this order (start-up first, on the quietest machine)
    "startup",
    "list",
    "index",
    "history",
    "purge",
    "publish",
    "e2e",
    "radix",
    "hops",
    "peers",
    "seeds",
    "scale",
    "engine43",
    "long",
    "layout",
)
OPT_IN = ("long", "layout")
"""Run only when named (``--only``): an hour of long delays, and a one-off comparison."""
Figure = dict[str, Any]
Figures = dict[str, Figure]


def fig(value: Any, unit: str = "", **extra: Any) -> Figure:
    if isinstance(value, float) and math.isnan(value):
        value = None
    return {"value": value, "unit": unit, **{k: v for k, v in extra.items() if v is not None}}


def _get(doc: Any, *path: str) -> Any:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc


def _lateness(out: Figures, key: str, entry: dict[str, Any], ratios: dict[str, Any]) -> None:
    for q in ("p50", "p99", "max"):
        out[f"{key}.{q}"] = fig(entry.get(f"{q}_ms"), "ms", ratio=ratios.get(f"{q}_ms"))


# ---------------------------------------------------------------------- one per workload


def from_publish(r: dict[str, Any]) -> Figures:
    return dict(r["figures"])


def from_startup(r: dict[str, Any], params: dict[str, Any]) -> Figures:
    out: Figures = {"startup.pika.before": fig(params.get("reference_ms_of_targets"), "ms")}
    for name, row in r.items():
        target = None
        if "target_ms" in row:
            verdict = "met" if row["meets_target_ratio"] else "missed"
            target = f"{row['target_ms']:.0f} ms = {row['target_ratio']:.2f} x: {verdict}"
        out[f"startup.{name}"] = fig(
            row["median_ms"],
            "ms",
            ratio=row["ratio_to_reference"],
            to="startup.reference",
            runs=row.get("runs_ms"),
            before=row.get("before_ms"),
            target=target,
            text=params["commands"][name],
        )
        if "ratio_to_pika_script" in row:
            target = None
            if "target_script_ratio" in row:
                verdict = "met" if row["meets_target_script_ratio"] else "missed"
                target = f"<= {row['target_script_ratio']:.1f} x: {verdict}"
            out[f"startup.{name}.script"] = fig(row["ratio_to_pika_script"], "ratio", target=target)
    return out


LIST_SHOWN = {
    "raw": "raw read of the stream (pika, from the first offset, to a marker)",
    "raw json": "raw read, and json.loads of every record",
    "raw list": "raw read, parse, keep the copies, sort those ahead, print JSON lines",
    "table": "rmqdelay scheduled list > file",
    "json": "rmqdelay scheduled list --json",
    "limit": "rmqdelay scheduled list --limit 20",
}


def _timed_rows(
    workload: str, shown: dict[str, str], r: dict[str, Any], reference: str, unit: str = "s"
) -> Figures:
    """One figure per command row (median, ratio to ``reference``'s row, runs, peak RSS),
    in seconds or, ``unit="ms"``, milliseconds."""
    scale = 1000 if unit == "ms" else 1
    out: Figures = {}
    for name, text in shown.items():
        row = r.get(name)
        if not isinstance(row, dict):
            continue
        out[f"{workload}.{name.replace(' ', '_')}"] = fig(
            row["median_s"] * scale,
            unit,
            ratio=row[f"ratio_to_{reference}"],
            to=f"{workload}.{reference}",
            runs=[v * scale for v in row.get("runs_s", [])],
            rss=row.get("peak_rss_mib"),
            text=text,
        )
    return out


def from_list(r: dict[str, Any], params: dict[str, Any]) -> Figures:
    out: Figures = {"list.messages": fig(params.get("messages"), "messages")}
    return out | _timed_rows("list", LIST_SHOWN, r, "raw")


INDEX_SHOWN = {
    "limit": "rmqdelay scheduled list --limit 50 (fresh process)",
    "cold": "a dashboard started now: read the journal into the index, then the first page",
    "warm": "the first page of a running dashboard's index, soonest first",
    "warm newest": "the same, newest first",
    "warm fresh": "caught_up() (a marker written and read back), then the first page",
    "http": "GET /api/scheduled?limit=50 of a running rmqdelay dashboard",
}


def from_index(r: dict[str, Any], params: dict[str, Any]) -> Figures:
    out: Figures = {"index.messages": fig(params.get("messages"), "messages")}
    out |= _timed_rows("index", INDEX_SHOWN, r, "limit", unit="ms")
    cold = r.get("cold") or {}
    out["index.cold.read"] = fig(cold.get("read_s"), "s")
    out["index.cold.page"] = fig(_ms(cold.get("page_s")), "ms")
    out["index.dashboard.first"] = fig(_get(r, "dashboard", "first_page_s"), "s")
    follower = r.get("follower") or {}
    out["index.follower.read"] = fig(follower.get("read_s"), "s")
    out["index.follower.rss"] = fig(follower.get("rss_growth_mib"), "MiB")
    return out


HISTORY_SHOWN = {
    "worker": "worker start to first handled",
    "list": "scheduled list --limit 50",
    "cancel": "cancel ID",
    "keyed": "keyed publish (CLI)",
    "dashboard": "dashboard start to first page",
    "restart": "dashboard restart to first page",
}


def from_history(r: dict[str, Any]) -> Figures:
    """Per cell (``h10m_p1m``: 10M records of history, 1M pending), each operation's
    median with its ratio to the same at no history, the bytes it read, its peak RSS."""
    out: Figures = {}
    for name, cell in r.items():
        disk = cell.get("disk_bytes") or {}
        out[f"history.{name}.history"] = fig(cell["history"], "records")
        out[f"history.{name}.pending"] = fig(cell["pending"], "records")
        out[f"history.{name}.disk"] = fig(_mb(disk.get("journal")), "MB")
        out[f"history.{name}.checkpoints_disk"] = fig(_mb(disk.get("checkpoints")), "MB")
        for op, text in HISTORY_SHOWN.items():
            row = cell["operations"].get(op)
            if row is None:
                continue
            out[f"history.{name}.{op}"] = fig(
                row["median_s"],
                "s",
                ratio=row.get("ratio_to_no_history"),
                runs=row.get("runs_s"),
                rss=row.get("peak_rss_mib"),
                read_mb=_mb(row.get("read_bytes")),
                ready=row.get("ready_s"),
                text=text,
            )
        ratios = {
            op: row["ratio_to_no_history"]
            for op, row in cell["operations"].items()
            if op in HISTORY_SHOWN and row.get("ratio_to_no_history") is not None
        }
        if ratios:  # the target: the worst of a cell's ratios, and whose it is
            worst = max(ratios, key=ratios.__getitem__)
            out[f"history.{name}.worst"] = fig(ratios[worst], "x", text=HISTORY_SHOWN[worst])
    return out


def from_purge(r: dict[str, Any]) -> Figures:
    """A selective purge of a tenth of ``pending`` (by destination, by header), the dry
    run's count and a cancel of one id, each in a fresh process."""
    out: Figures = {"purge.pending": fig(r["pending"], "records")}
    out["purge.count"] = fig(r["count_s"], "s", runs=r["count_runs_s"], count=r["counted"])
    out["purge.one_id"] = fig(r["one_id_s"], "s")
    for name in ("by_destination", "by_header"):
        row = r[name]
        cancelled = row["answer"]["cancelled"]
        out[f"purge.{name}"] = fig(
            row["s"],
            "s",
            count=cancelled,
            rate=round(cancelled / row["s"]),
            rss=row["peak_rss_mib"],
        )
    return out


def _mb(size: Any) -> Any:
    return None if size is None else size / 1e6


def _ms(seconds: Any) -> Any:
    return None if seconds is None else seconds * 1000


def _cpu(c: dict[str, Any], to: str | None, ratio: Any) -> Figure:
    """Broker CPU per delivered message (its background subtracted), each round's too."""
    return fig(
        _get(c, "cpu_us_per_msg", "broker_net"),
        "µs/msg",
        ratio=ratio,
        to=to,
        runs=[_get(run, "cpu", "broker_net_us_per_msg") for run in c.get("all_runs", [])],
    )


def _hops(out: Figures, key: str, c: dict[str, Any]) -> None:
    """Mean hops planned (``PublishResult.hops``) and taken (the broker's ``x-death``)."""
    out[f"{key}.hops"] = fig(c.get("mean_hops"), "hops")
    out[f"{key}.xdeath"] = fig(c.get("mean_x_death_hops"), "hops")


def from_e2e(r: dict[str, Any], params: dict[str, Any]) -> Figures:
    """``e2e.r500.p99`` (the tiers), ``e2e.held.r500.p99`` (a held destination),
    ``e2e.r500.plain.p99`` (the plain queue in the same rounds; ratios are to it),
    ``e2e.held.r500.cpu`` (broker, with its ratio to ``e2e.r500.plain.cpu``)..."""
    limit = r["plain_limit"]
    out: Figures = {
        "e2e.limit": fig(
            limit.get("publish_consume_rate_per_s"),
            "msgs/s",
            runs=limit.get("publish_consume_rate_runs"),
            client_cpu_us=_get(limit, "cpu", "client_us_per_msg"),
            broker_cpu_us=_get(limit, "cpu", "broker_net_us_per_msg"),
        ),
        "e2e.repeats": fig(params["repeats"]),
    }
    rows: list[tuple[str, dict[str, Any], dict[str, Any] | None, str | None]] = []
    sides = (("", r["rates"]), ("held.", r.get("held")), ("held-narrow.", r.get("held_narrow")))
    for side, by_rate in ((side, by_rate or {}) for side, by_rate in sides):
        rows += [
            (f"{side}r{float(rate):g}", e, r["plain_latency"].get(rate), f"r{float(rate):g}")
            for rate, e in by_rate.items()
        ]
    for side, name in (("", "saturation"), ("held.", "held_saturation")):
        if r.get(name):
            rows.append((f"{side}saturation", r[name], None, None))
    for name, e, plain, plain_name in rows:
        key = f"e2e.{name}"
        _lateness(out, key, e, e.get("ratio_to_plain_latency") or {})
        if plain:
            _lateness(out, f"e2e.{plain_name}.plain", plain, {})
            out[f"e2e.{plain_name}.plain.cpu"] = _cpu(plain, None, None)
        out[f"{key}.early"] = fig(e["early_total"])
        out[f"{key}.delivered"] = fig(
            e["delivered_per_s"], "msgs/s", ratio=e.get("ratio_to_plain_limit"), to="e2e.limit"
        )
        _hops(out, key, e)
        out[f"{key}.offered"] = fig(e.get("rate_per_s"), "msgs/s")
        ratio = e.get("broker_cpu_ratio_to_plain")
        out[f"{key}.cpu"] = _cpu(e, plain_name and f"e2e.{plain_name}.plain.cpu", ratio)
        for proc, us in (e.get("cpu_us_per_msg") or {}).items():
            out[f"{key}.cpu.{proc}"] = fig(us, "µs/msg")
    return out


RADIX_IDS = {"radix 16 + named 15m": "r16named"}


def from_radix(r: dict[str, Any]) -> Figures:
    out: Figures = {"radix.limit": fig(r.get("plain_limit_per_s"), "msgs/s")}
    for label, c in r["configs"].items():
        key = "radix." + RADIX_IDS.get(label, label.replace("radix ", "r"))
        ratios = c.get("ratio_to_radix16") or {}
        _lateness(out, key, c["steady"], ratios)
        out[f"{key}.tiers"] = fig(c["tiers"], "queues")
        out[f"{key}.hops"] = fig(c["steady"]["mean_hops"], "hops")
        out[f"{key}.hops15m"] = fig(c["planned_hops_named_delay"])
        out[f"{key}.early"] = fig(
            int(c["steady"]["early_total"] or 0) + int(_get(c, "saturation", "early_total") or 0)
        )
        out[f"{key}.saturation"] = fig(
            _get(c, "saturation", "delivered_per_s"),
            "msgs/s",
            ratio=ratios.get("saturation_delivered_per_s"),
            to="radix.r16.saturation",
        )
    return out


def from_hops(r: dict[str, Any], params: dict[str, Any]) -> Figures:
    """Per rate and config, ``hops.held.r500.cpu`` (ratio to ``hops.plain.r500.cpu``),
    ``hops.held.r500.p99``, ``hops.held.r500.floor``...; the last rate's figures also
    without the rate (``hops.rmqdelay.cpu``, ``hops.floor.cpu``), as the page has them."""
    rates = r.get("rates") or {str(params.get("rate")): r}  # before 250 and 500: one rate
    main = str(float(params.get("rates", [params.get("rate")])[-1]))
    out: Figures = {
        "hops.rate": fig(float(main), "msgs/s"),
        "hops.duration": fig(params.get("duration_s"), "s"),
        "hops.rounds": fig(params.get("rounds")),
    }
    for rate, at in rates.items():
        suffix = f".r{float(rate):g}"
        mine: Figures = {}
        for name, c in at["configs"].items():
            key = f"hops.{name}{suffix}"
            to = f"hops.plain{suffix}.cpu"
            mine[f"{key}.cpu"] = _cpu(c, to, c.get("broker_cpu_ratio_to_plain"))
            _lateness(mine, key, c, c.get("ratio_to_plain_latency") or {})
            mine[f"{key}.early"] = fig(c.get("early_total"))
            mine[f"{key}.missing"] = fig(c.get("missing_total"))
            mine[f"{key}.delivered"] = fig(c.get("delivered_per_s"), "msgs/s")
            if name in ("rmqdelay", "held", "held-narrow"):
                _hops(mine, key, c)
        floors = at.get("floors") or {"rmqdelay": at.get("floor")}
        for name, floor in floors.items():
            floor = floor or {}
            key = "hops.floor" if name == "rmqdelay" else f"hops.floor.{name}"
            mine[f"{key}{suffix}.cpu"] = fig(
                floor.get("broker_us_per_msg"),
                "µs/msg",
                ratio=floor.get("ratio_to_plain"),
                to=f"hops.plain{suffix}.cpu",
                text=floor.get("how"),
            )
            mine[f"{key}{suffix}.per_hop"] = fig(floor.get("per_hop_us"), "µs/hop")
        out |= mine
        if float(rate) == float(main):  # the page's keys: the last rate's, without it
            out |= {k.replace(suffix, "", 1): _unsuffixed(f, suffix) for k, f in mine.items()}
    return out


def _unsuffixed(f: Figure, suffix: str) -> Figure:
    return {**f, "to": f["to"].replace(suffix, "", 1)} if "to" in f else f


def from_long(r: dict[str, Any], params: dict[str, Any]) -> Figures:
    """``long.held.p99``, ``long.tiers.early``, ``long.held.hops``... (no reference: the
    tiers and the held destination ran at once)."""
    low, high = params["delays_ms"]
    out: Figures = {
        "long.delays": fig(None, text=f"{low / 60_000:g} to {high / 60_000:g} min"),
        "long.n": fig(params.get("n"), "messages"),
        "long.rate": fig(params.get("rate"), "msgs/s"),
    }
    for name, c in r["configs"].items():
        key = f"long.{name}"
        _lateness(out, key, c.get("stats") or {}, {})
        out[f"{key}.early"] = fig(_get(c, "stats", "early"))
        out[f"{key}.missing"] = fig(_get(c, "stats", "missing"))
        _hops(out, key, c.get("hops") or {})
    return out


def from_layout(r: dict[str, Any], params: dict[str, Any]) -> Figures:
    """``layout.held-nolinger.cpu`` (ratio to ``layout.held.cpu``), ``layout.idle.held``
    (the broker's idle CPU in ms a second with the held topology)..."""
    out: Figures = {"layout.rate": fig(params.get("rate"), "msgs/s")}
    for name, c in r["configs"].items():
        key = f"layout.{name}"
        to = None if name == "held" else "layout.held.cpu"
        out[f"{key}.cpu"] = _cpu(c, to, None if to is None else c.get("broker_cpu_ratio_to_held"))
        out[f"{key}.cpu.plain"] = fig(c.get("broker_cpu_ratio_to_plain"), "ratio")
        _lateness(out, key, c, c.get("ratio_to_plain_latency") or {})
        out[f"{key}.early"] = fig(c.get("early_total"))
        if name != "plain":
            _hops(out, key, c)
    idle = r.get("idle") or {}
    for name, value in (idle.get("broker_cpu_ms_per_s") or {}).items():
        out[f"layout.idle.{name}"] = fig(value, "ms/s", runs=_get(idle, "runs", name))
    out["layout.idle.unused"] = fig(idle.get("unused_tier_queues"), "queues")
    out["layout.idle.per_queue"] = fig(idle.get("per_unused_queue_ms_per_s"), "ms/s")
    return out


def from_peers(r: dict[str, Any], params: dict[str, Any]) -> Figures:
    extras = r["extras"]
    out: Figures = {
        "peers.reference.publish": fig(
            _get(extras, "plain_publish_only", "publish_rate_per_s"), "msgs/s"
        ),
        "peers.repeats": fig(params["repeats"]),
    }
    for name, d in r["designs"].items():
        key = f"peers.{name}"
        out[f"{key}.name"] = fig(None, text=d["name"])
        out[f"{key}.publish"] = fig(
            _get(d, "publish_rate", "publish_rate_per_s"),
            "msgs/s",
            ratio=d.get("publish_ratio_to_plain"),
            to="peers.reference.publish",
        )
        steady = d.get("steady") or {}
        _lateness(out, key, steady, d.get("lateness_ratio_to_plain_latency") or {})
        out[f"{key}.early"] = fig(steady.get("early_total"))
        out[f"{key}.missing"] = fig(steady.get("missing_total"))
        if not d.get("supports_delay", True):  # the seeds' scenario needs delays
            out[f"seeds.{name}.order"] = fig(None, text="n/a")
            out[f"seeds.{name}.max"] = fig(None)
    for k in extras.get("redis_kill9") or []:
        out[f"peers.redis.kill9.{k['mode']}"] = fig(k["lost"], "messages", written=k["written"])
    dram = extras.get("dramatiq")
    if dram:
        m, ct = dram["memory"], dram["consumer_timeout"]
        out["peers.dramatiq.held"] = fig(m["held_unacked"], "messages", prefetch=m["prefetch"])
        out["peers.dramatiq.heap"] = fig(m.get("python_heap_bytes_per_held_message"), "B/msg")
        out["peers.dramatiq.rss"] = fig(m.get("bytes_per_held_message"), "B/msg")
        out["peers.dramatiq.consumer_timeout"] = fig(ct["consumer_timeout_ms"], "ms")
    return out


def from_seeds(r: dict[str, Any]) -> Figures:
    out: Figures = {}
    for name, d in r.items():
        if "arrival_order" in d:
            order = ",".join(m.split("-")[1].rstrip("s") for m in d["arrival_order"])
            out[f"seeds.{name}.order"] = fig(None, text=order)
            out[f"seeds.{name}.max"] = fig(d["stats"]["max_ms"], "ms")
            out[f"seeds.{name}.early"] = fig(d["stats"]["early"])
        else:
            out[f"seeds.{name}.order"] = fig(None, text="error" if "error" in d else "n/a")
    return out


def scale_memory(res: dict[str, Any]) -> dict[str, Any]:
    """Broker memory and disk against pending messages, from the scale snapshots.

    The quorum WAL keeps its entries in memory until it rolls over, then frees them: growth
    from the 0 snapshot depends on where the rollovers fell. So the slopes are fitted over
    the second half of the fill (least squares); every RSS drop is reported as a rollover.
    """
    snaps = sorted((int(k), v) for k, v in res["snapshots"].items() if k.isdigit())
    half = [(k, v) for k, v in snaps if k >= res["params"]["messages"] // 2]

    def slope(key: str) -> float | None:
        pts = [(k, v.get(key)) for k, v in half if v.get(key) is not None]
        if len(pts) < 2:
            return None
        mx, my = sum(k for k, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
        den = sum((k - mx) ** 2 for k, _ in pts)
        return sum((k - mx) * (y - my) for k, y in pts) / den if den else None

    rss = [(k, v.get("mem_rss_bytes") or 0) for k, v in snaps]
    drops = [(k, a - b) for (_, a), (k, b) in itertools.pairwise(rss) if a - b > 16 * 2**20]
    return {
        "rss": slope("mem_rss_bytes"),
        "wal": (slope("mem_quorum_ets_bytes") or 0) + (slope("mem_binary_bytes") or 0),
        "procs": slope("mem_quorum_procs_bytes"),
        "disk": slope("disk_quorum_dir_allocated_bytes"),
        "peak": max((v for _, v in rss), default=None),
        "rollovers": drops,
    }


def from_scale(r: dict[str, Any]) -> Figures:
    p, fill, d = r["params"], r["fill"], r["drain"]
    out: Figures = {
        "scale.messages": fig(p["messages"], "messages"),
        "scale.chunk": fig(p["chunk"], "messages"),
        "scale.margin": fig(p["margin_s"], "s"),
        "scale.publisher": fig(None, text=p["publisher"]),
        "scale.fill.seconds": fig(fill["seconds"], "s"),
        "scale.fill.rate": fig(fill["rate_per_s"], "msgs/s"),
        "scale.fill.hops": fig(fill["hops"]["mean_hops"], "hops"),
    }
    levels = sorted(r["at_levels"], key=int)
    for level in levels:
        e, snap = r["at_levels"][level], r["snapshots"].get(level) or {}
        key = f"scale.at{level}"
        out[f"{key}.pending"] = fig(int(level), "messages")
        out[f"{key}.publish"] = fig(
            e["publish_rate_per_s"], "msgs/s", ratio=e["ratio_to_reference"], to=f"{key}.reference"
        )
        out[f"{key}.reference"] = fig(e["reference_rate_per_s"], "msgs/s")
        wal = (snap.get("mem_quorum_ets_bytes") or 0) + (snap.get("mem_binary_bytes") or 0)
        for name, value in (
            ("rss", snap.get("mem_rss_bytes")),
            ("wal", wal),
            ("procs", snap.get("mem_quorum_procs_bytes")),
            ("disk", snap.get("disk_quorum_dir_allocated_bytes")),
        ):
            out[f"{key}.{name}"] = fig(None if value is None else value / 2**20, "MiB")
    first, last = r["at_levels"][levels[0]], r["at_levels"][levels[-1]]
    out["scale.flat"] = fig(last["publish_rate_per_s"] / first["publish_rate_per_s"], "ratio")
    mem = scale_memory(r)
    for name in ("rss", "wal", "procs", "disk"):
        out[f"scale.per_msg.{name}"] = fig(mem[name], "B/msg")
    out["scale.peak_rss"] = fig((mem["peak"] or 0) / 2**30, "GiB")
    drops = ", ".join(f"{b / 2**20:,.0f} MiB at {k:,}" for k, b in mem["rollovers"]) or "none"
    out["scale.rollovers"] = fig(max((b for _, b in mem["rollovers"]), default=0) / 2**20, "MiB")
    out["scale.rollovers"]["text"] = drops
    lateness = d["lateness"]
    out |= {
        "scale.drain.delivered": fig(d["delivered_unique"], "messages"),
        "scale.drain.missing": fig(d["missing"], "messages"),
        "scale.drain.duplicates": fig(d["duplicates"], "messages"),
        "scale.drain.early": fig(lateness["early"], "messages"),
        "scale.drain.all": fig(bool(d["all_delivered"])),
        "scale.drain.seconds": fig(d["seconds"], "s"),
        "scale.drain.rate": fig(
            d["rate_per_s"], "msgs/s", ratio=d.get("ratio_to_reference_publish")
        ),
        "scale.drain.p50": fig(lateness["p50_ms"] / 1000, "s"),
        "scale.drain.max": fig(lateness["max_ms"] / 1000, "s"),
        "scale.drain.hops": fig(d.get("mean_x_death_hops"), "hops"),
        "scale.drain.broker_per_hop": fig(_get(d, "cpu", "broker_us_per_hop"), "µs/hop"),
        "scale.drain.worker": fig(_get(d, "cpu", "worker_us_per_msg"), "µs/msg"),
    }
    return out


def _ratio(value: Any, to: Any) -> float | None:
    if not isinstance(value, (int, float)) or not isinstance(to, (int, float)) or not to:
        return None
    return round(value / to, 3)


def from_engine43(doc: dict[str, Any]) -> Figures:
    """``engine43.r250.deferred.p99`` (ratio to the tiers' in the same run),
    ``engine43.r250.deferred.sched.p99`` (at the scheduler: no forward hop),
    ``engine43.r250.tiers.cpu.broker``, ``engine43.memory.deferred.erlang``,
    ``engine43.restart.deferred.missing``..."""
    r, params = doc["results"], doc["params"]
    medians = r.get("medians", {})
    load = _get(doc, "load_before", "loadavg") or ["?"]
    where = f"RabbitMQ {_get(doc, 'broker', 'version')}, load {load[0]} before it"
    out: Figures = {
        "engine43": fig(None, text=where),
        "engine43.repeats": fig(params.get("repeats")),
        "engine43.duration": fig(params.get("duration"), "s"),
    }
    for label, by_design in medians.items():
        if not label.startswith("load."):
            continue
        rate = label.removeprefix("load.")
        tiers = by_design.get("tiers", {})
        for design, m in by_design.items():
            key = f"engine43.{rate}.{design}"
            ref = tiers if design != "tiers" else {}
            for q in ("p50", "p99", "max"):
                out[f"{key}.{q}"] = fig(
                    m.get(f"{q}_ms"), "ms", ratio=_ratio(m.get(f"{q}_ms"), ref.get(f"{q}_ms"))
                )
            for part in ("broker", "worker", "scheduler"):
                value = m.get(f"{part}_cpu_ms_per_msg")
                ratio = _ratio(value, ref.get(f"{part}_cpu_ms_per_msg"))
                out[f"{key}.cpu.{part}"] = fig(value, "ms/msg", ratio=ratio)
            out[f"{key}.early"] = fig(m.get("early"))
            out[f"{key}.missing"] = fig(m.get("missing"))
            sched = m.get("at_scheduler") or {}
            for q in ("p50", "p99", "max"):
                if sched:
                    out[f"{key}.sched.{q}"] = fig(sched.get(f"{q}_ms"), "ms")
    for design, m in (medians.get("memory") or {}).items():
        key = f"engine43.memory.{design}"
        out[f"{key}.waiting"] = fig(m.get("waiting"), "messages")
        out[f"{key}.erlang"] = fig(m.get("erlang_bytes_per_msg"), "B/msg")
        out[f"{key}.rss"] = fig(m.get("rss_bytes_per_msg"), "B/msg")
        out[f"{key}.publish"] = fig(m.get("publish_per_s"), "msgs/s")
        if "deferred_per_s" in m:
            out[f"{key}.rate"] = fig(m.get("deferred_per_s"), "msgs/s")
    for design, m in [
        *((f"restart.{d}", m) for d, m in (medians.get("restart") or {}).items()),
        *((f"failover.{d}", m) for d, m in (medians.get("failover") or {}).items()),
    ]:
        key = f"engine43.{design}"
        for field in ("count", "missing", "early", "duplicates"):
            out[f"{key}.{field}"] = fig(m.get(field))
        out[f"{key}.p99"] = fig(m.get("p99_ms"), "ms")
        out[f"{key}.max"] = fig(m.get("max_ms"), "ms")
        out[f"{key}.down"] = fig(m.get("down_s"), "s")
    return out


EXTRACT: dict[str, Callable[[dict[str, Any]], Figures]] = {
    "publish": lambda doc: from_publish(doc["results"]),
    "startup": lambda doc: from_startup(doc["results"], doc["params"]),
    "list": lambda doc: from_list(doc["results"], doc["params"]),
    "index": lambda doc: from_index(doc["results"], doc["params"]),
    "history": lambda doc: from_history(doc["results"]),
    "purge": lambda doc: from_purge(doc["results"]),
    "e2e": lambda doc: from_e2e(doc["results"], doc["params"]),
    "radix": lambda doc: from_radix(doc["results"]),
    "hops": lambda doc: from_hops(doc["results"], doc["params"]),
    "peers": lambda doc: from_peers(doc["results"], doc["params"]),
    "seeds": lambda doc: from_seeds(doc["results"]),
    "scale": lambda doc: from_scale(doc["results"]),
    "engine43": from_engine43,
    "long": lambda doc: from_long(doc["results"], doc["params"]),
    "layout": lambda doc: from_layout(doc["results"], doc["params"]),
}


def _early(figures: Figures) -> Iterator[int]:
    """Every early count of an rmqdelay run (the other designs may be early)."""
    for key, f in figures.items():
        parts = key.split(".")
        if parts[-1] != "early" or not isinstance(f.get("value"), int):
            continue
        ours = parts[0] in ("e2e", "radix", "scale", "long")
        ours = ours or parts[1].startswith(("rmqdelay", "held"))
        ours = ours and not parts[1].endswith("-bare")  # a diagnostic consumer that holds none
        if ours or (parts[0] == "engine43" and "tiers" in parts):  # the tiers, on 4.3
            yield f["value"]


def collect(results: Path) -> dict[str, Any]:
    """figures.json's content: the keys, and when and where each workload measured them."""
    figures: Figures = {}
    measured: dict[str, Any] = {}
    for workload in WORKLOADS:
        path = results / f"{workload}.json"
        if not path.exists():
            continue
        doc = json.loads(path.read_text(encoding="utf-8"))
        figures |= EXTRACT[workload](doc)
        measured[workload] = {
            "date": time.strftime("%Y-%m-%d", time.gmtime(doc["generated_at_ms"] / 1000)),
            "machine": doc.get("machine"),
            "broker": doc.get("broker"),
            "load_before": doc.get("load_before"),
        }
    early = list(_early(figures))
    if early:
        figures["all.early"] = fig(sum(early), "messages")
    return {"measured": measured, "figures": figures}
