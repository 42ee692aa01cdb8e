"""Draw the plots and regenerate the README "Performance" section from bench/results/*.json.

    python -m bench report                      # bench/results -> plots + README.md
    python -m bench report --results DIR --no-readme

The section sits between ``<!-- performance:start -->`` and ``<!-- performance:end -->``;
everything between the markers is replaced, nothing else in the README is touched. Every
figure in it comes from the JSON files; the notes on what limits each figure are kept in
:data:`LIMITS` below and are chosen by whether the target was met.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from bench import plots

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "bench" / "results"
README = ROOT / "README.md"
START, END = "<!-- performance:start -->", "<!-- performance:end -->"

#: How each design was run, one line each (the JSON holds the full description).
HOW_RUN = {
    "plain": "the limit, not a delay design: aio-pika confirmed publish through the default "
    "exchange into one quorum queue, one aio-pika consumer; delays ignored",
    "rmqdelay": "this project: `AsyncPublisher.publish_many` (confirms), radix 16, 10 ms, "
    "quorum tiers from `TopologyManager`; drained by the real `rmqdelay.Worker` (async "
    "handler) in its own process",
    "rmqdelay-sync": "this project with the pika `Publisher` (one thread) instead",
    "naive": "the seeds' design: one quorum queue, per-message `expiration`, dead-lettering "
    "into the work queue (aio-pika, confirms)",
    "kombu-cascade": "Celery/kombu native delayed delivery: the 28-level cascade declared by "
    "kombu 5.7's own `native_delayed_delivery` functions (private prefix), routing keys from "
    "`calculate_routing_key`, whole seconds truncated as Celery 5.5 does; aio-pika publishes "
    "with confirms; no Celery worker (transport only)",
    "kombu-cascade-ceil": "the same cascade with the countdown rounded up (never early; not "
    "what Celery does)",
    "dramatiq-style": "our reimplementation of dramatiq's RabbitMQ delay queue (dramatiq is "
    "not installed here): the worker holds deliveries unacked in memory until their eta, then "
    "re-enqueues them",
    "redis-off": "the seeds' Redis sorted set: private `redis-server`, persistence off, "
    "pipelined ZADD, a Lua pop every 10 ms (no ack)",
    "redis-everysec": "the same with AOF `appendfsync everysec`",
    "redis-always": "the same with AOF `appendfsync always`",
}

#: What limits each target's figure, by key and by whether it was met. The texts take
#: figures from the JSON (``{name}`` placeholders, filled by :func:`_limit`); the evidence
#: behind them is in bench/README.md, "What limits the figures".
LIMITS: dict[str, dict[str, str]] = {
    "publish_sync": {
        "met": "the broker: rmqdelay's client work is {c_sync} µs of CPU per message against "
        "raw pika's {c_raw}",
        "missed": "the broker's cost of the tiers: raw pika sending rmqdelay's own messages, "
        "planned beforehand, into the tiers reaches only {diag_tiers} of its rate into one "
        "queue, and the broker spends {b_tiers} µs per message on them against {b_plain} for "
        "one plain queue (messages spread over about 20 quorum queues with TTLs). Into one "
        "queue (delay 0) rmqdelay reaches {diag_zero}; its client work is {c_sync} µs of CPU "
        "per message against raw pika's {c_raw}",
        "missed_client": "rmqdelay's own work, not the broker: raw pika sending rmqdelay's "
        "own messages, planned beforehand, into the tiers reaches {diag_tiers} of its rate into "
        "one queue. Of rmqdelay's gap, the validate-first phase of `publish_many` (every "
        "request validated and encoded before the first is sent, while the broker idles: the "
        "documented contract) is the step from {sync} to {send_phase}, the send phase timed "
        "with the batch already prepared; the rest is the send phase's own work, the journal's "
        "records and {c_send} µs of client CPU per message against {c_tiers} for raw pika "
        "sending the same messages. With the journal off the whole call reaches {off_sync}",
    },
    "publish_async": {
        "met": "rmqdelay writes each window's frames itself ({c_async} µs of client CPU per "
        "message against aio-pika's {c_aio}); raw aiormq reaches {aiormq}",
        "missed": "the tiers (see the sync row) and client CPU ({c_async} µs per message "
        "against aio-pika's {c_aio})",
    },
    "publish_single": {
        "met": "one round trip per call, as for raw pika",
        "missed": "the schedule journal: each publish() also writes its record to the stream "
        "and waits for both confirms. Raw pika doing the same (a message into the tiers and "
        "its record, both confirmed, per call) reaches {diag_single_journal}; with the "
        "journal off rmqdelay reaches {off}, and raw pika sending rmqdelay's messages into "
        "the tiers one at a time {diag_single}",
    },
    "p99_500": {
        "met": "rounding up to 10 ms (0 to 10, mean 4.5) plus the plain queue's own latency "
        "(p99 {plain_p99} ms at this rate) plus about 1 ms per hop at the median ({hops} hops)",
        "missed": "run-to-run noise of the shared 2-core machine, on top of rounding up to "
        "10 ms (0 to 10, mean 4.5) and the plain queue's own latency (p99 {plain_p99} ms). "
        "Beyond rounding a hop adds about 1 ms at the median and 3 to 4 ms at p99 on a quiet "
        "broker ({hops} hops a message), but when the broker is disturbed each hop (a "
        "dead-letter into the next quorum queue) is exposed again, so the tail grows with "
        "the hops. So it sits near the target rather than structurally over it",
    },
    "early": {
        "met": "delays round up and the tiers' TTLs add up to exactly the rounded delay",
        "missed": "a bug: a message must never be early",
    },
    "delivered": {
        "met": "the machine's CPU: at saturation, per delivered message, the broker uses "
        "{b_sat} µs (the hops: {hops} per message), the publisher {c_sat} and the Worker "
        "{w_sat}. The limit itself is bound by its Python client, which publishes and "
        "consumes in one process ({c_limit} µs per message)",
        "missed": "the machine's 2 cores: at saturation they are busy {m_sat} µs per "
        "delivered message: the broker {b_sat} (every hop is a dead-letter between quorum "
        "queues, {hops} hops per message; {b_hop} µs per hop in the scale drain), the "
        "publisher {c_sat}, the Worker {w_sat}. The plain queue needs {b_limit} µs of broker "
        "and {c_limit} of client CPU per message (queue set-up included)",
    },
    "scale_flat": {
        "met": "tiers are FIFO queues, so publishing costs the same at 0 and at 1M pending. "
        "Memory is bounded by the quorum WAL, not by pending messages: its entries stay in "
        "memory ({wal} B per message: ETS and bodies) until it rolls over and frees them "
        "(RSS fell by {drop} MiB once); the queues keep about {procs} B per pending message. "
        "Disk: about {disk} B per pending message",
        "missed": "see bench/README.md (scale)",
    },
    "scale_all": {
        "met": "quorum tiers with at-least-once dead-lettering. The drain rate ({rate}/s, all "
        "due at once) is the machine's 2 cores: {b_hop} µs of broker CPU per hop x {hops} "
        "hops, plus {w} µs per message in the Worker",
        "missed": "a bug: every message must arrive",
    },
}


def _limit(key: str, met: bool, values: dict[str, Any]) -> str:
    which = "met" if met else "missed"
    tiers = values.get("diag_tiers")
    if not met and key == "publish_sync" and tiers is not None and tiers >= 0.9:
        which = "missed_client"  # the tiers leave room: the gap is rmqdelay's own
    text = LIMITS[key][which]

    def nd(v: Any) -> int:
        return 2 if isinstance(v, float) and v < 10 and v != int(v) else 0

    clean = {k: fmt(v, nd(v)) for k, v in values.items()}
    try:
        return text.format(**clean)
    except (KeyError, IndexError):
        return text


def load(results: Path, workload: str) -> dict[str, Any] | None:
    return plots.load(results, workload)


def fmt(value: Any, nd: int = 0, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, (int, float)):
        return f"{value:,.{nd}f}{suffix}"
    return str(value)


def ratio(value: Any) -> str:
    return "-" if value is None else f"{value:.2f}"


def lat(entry: dict[str, Any] | None) -> str:
    if not entry:
        return "-"
    return f"{fmt(entry.get('p50_ms'))} / {fmt(entry.get('p99_ms'))} / {fmt(entry.get('max_ms'))}"


def _mark(met: bool | None) -> str:
    return {True: "**met**", False: "**not met**", None: "not run"}[met]


# ---------------------------------------------------------------- sections


def _get(doc: dict[str, Any] | None, *path: str) -> Any:
    value: Any = doc
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def targets(results: Path) -> list[str]:
    publish, e2e, scale = (load(results, w) for w in ("publish", "e2e", "scale"))
    peers, seeds, radix = (load(results, w) for w in ("peers", "seeds", "radix"))
    rows: list[tuple[str, str, bool | None, str]] = []
    b_hop = _get(scale, "results", "drain", "cpu", "broker_us_per_hop")
    if publish:
        r = publish["results"]
        ratio_of = r["ratio"]
        broker = r.get("broker_cpu_us_per_msg_median") or {}
        client = r.get("client_cpu_us_per_msg_median") or {}
        ref_of = r.get("reference_of") or {}
        values = {
            "diag_tiers": ratio_of.get("diag: raw pika, rmqdelay's messages to the tiers"),
            "diag_zero": ratio_of.get("diag: rmqdelay sync, delay 0"),
            "diag_zero_async": ratio_of.get("diag: rmqdelay async, delay 0"),
            "b_tiers": broker.get("rmqdelay sync"),
            "b_plain": broker.get("raw pika"),
            "c_sync": client.get("rmqdelay sync"),
            "c_raw": client.get("raw pika"),
            "c_async": client.get("rmqdelay async"),
            "c_aio": client.get("raw aio-pika"),
            "aiormq": ratio_of.get("raw aiormq"),
            "off": ratio_of.get("rmqdelay sync publish(), journal off"),
            "off_sync": ratio_of.get("rmqdelay sync, journal off"),
            "sync": ratio_of.get("rmqdelay sync"),
            "c_send": client.get(
                "diag: rmqdelay sync, send phase alone (the batch prepared before the clock)"
            ),
            "c_tiers": client.get("diag: raw pika, rmqdelay's messages to the tiers"),
            "send_phase": ratio_of.get(
                "diag: rmqdelay sync, send phase alone (the batch prepared before the clock)"
            ),
            "diag_single_journal": ratio_of.get(
                "diag: raw pika, one call = a message to the tiers and its journal record"
            ),
            "diag_single": ratio_of.get(
                "diag: raw pika, one confirm per publish, rmqdelay's messages to the tiers"
            ),
        }
        for key, name in (
            ("publish_sync", "rmqdelay sync"),
            ("publish_async", "rmqdelay async"),
            ("publish_single", "rmqdelay sync publish(), one at a time"),
        ):
            value, reference = ratio_of.get(name), ref_of.get(name, "raw aio-pika")
            if name not in r["median"]:
                continue
            met = value is not None and value >= 0.9
            rows.append(
                (
                    f"{name.removeprefix('rmqdelay ')} ≥ 0.9 x {reference}",
                    f"{ratio(value)} ({fmt(r['median'][name])} vs "
                    f"{fmt(r['median'][reference])} msgs/s)",
                    met,
                    _limit(key, met, values),
                )
            )
    if e2e:
        res = e2e["results"]
        t = res["targets"]
        at500 = res["rates"].get("500.0") or {}
        p99, target = t.get("p99_at_500_ms"), t.get("p99_at_500_target_ms")
        met = p99 is not None and target is not None and p99 <= target
        values = {
            "plain_p99": _get(res, "plain_latency", "500.0", "p99_ms"),
            "hops": at500.get("mean_hops"),
        }
        same = []  # the same workload, measured again in the same run by other workloads
        r16 = _get(radix, "results", "configs", "radix 16", "steady", "p99_ms")
        if r16 is not None:
            same.append(f"{fmt(r16)} ms in radix")
        pr = _get(peers, "results", "designs", "rmqdelay", "steady", "p99_ms")
        if pr is not None:
            same.append(f"{fmt(pr)} ms in peers")
        also = f"; the same workload: {', '.join(same)}" if same else ""
        rows.append(
            (
                f"p99 lateness at 500/s ≤ resolution + 15 ms = {fmt(target)} ms",
                f"{fmt(p99)} ms (p50 {fmt(at500.get('p50_ms'))}, max {fmt(at500.get('max_ms'))}"
                f"{also})",
                None if p99 is None else met,
                _limit("p99_500", met, values),
            )
        )
        value = t.get("delivered_ratio_to_limit")
        met = value is not None and value >= 0.5
        sat = res.get("saturation") or {}
        limit = res["plain_limit"].get("publish_consume_rate_per_s")
        sat_cpu = sat.get("cpu_us_per_msg") or {}
        values = {
            "b_sat": sat_cpu.get("broker_net", sat_cpu.get("broker")),
            "c_sat": sat_cpu.get("client"),
            "w_sat": sat_cpu.get("worker"),
            "m_sat": sat_cpu.get("machine"),
            "b_limit": _get(res, "plain_limit", "cpu", "broker_net_us_per_msg"),
            "c_limit": _get(res, "plain_limit", "cpu", "client_us_per_msg"),
            "hops": sat.get("mean_hops"),
            "b_hop": b_hop,
        }
        rows.append(
            (
                "delivered/s ≥ 50 % of the plain-queue limit (radix 16)",
                f"{ratio(value)} ({fmt(sat.get('delivered_per_s'))} vs {fmt(limit)} msgs/s)",
                None if value is None else met,
                _limit("delivered", met, values),
            )
        )
    early = _early_total(e2e, radix, peers, seeds, scale)
    if early is not None:
        rows.append(
            (
                "early messages: 0 (every rmqdelay run)",
                str(early),
                early == 0,
                _limit("early", early == 0, {}),
            )
        )
    if scale:
        s = scale["results"]
        levels = s["at_levels"]
        first, last = levels[min(levels, key=int)], levels[max(levels, key=int)]
        flat = (last["publish_rate_per_s"] or 0) / (first["publish_rate_per_s"] or math.nan)
        met = flat >= 0.8
        mem = scale_memory(s)
        values = {
            "rss": mem["rss_slope"],
            "wal": mem["wal_slope"],
            "procs": mem["procs_slope"],
            "disk": mem["disk_slope"],
            "peak": (mem["peak_rss"] or 0) / 2**30,
            "drop": (max((d for _, d in mem["rollovers"]), default=0)) / 2**20,
        }
        rows.append(
            (
                f"cost flat from 0 to {s['params']['messages']:,} pending",
                f"publish rate at {last['pending']:,} / at 0 = {flat:.2f} (ratio to the "
                f"reference {ratio(first['ratio_to_reference'])} at 0, "
                f"{ratio(last['ratio_to_reference'])} at {last['pending']:,}); broker RSS at "
                f"most {values['peak']:.2f} GiB",
                met,
                _limit("scale_flat", met, values),
            )
        )
        d = s["drain"]
        values = {
            "rate": d["rate_per_s"],
            "b_hop": b_hop,
            "hops": d.get("mean_x_death_hops"),
            "w": _get(d, "cpu", "worker_us_per_msg"),
        }
        rows.append(
            (
                f"all {s['params']['messages']:,} delivered after the fill",
                f"{d['delivered_unique']:,} delivered, {d['missing']} missing, "
                f"{d['duplicates']} duplicates; drain {fmt(d['rate_per_s'])}/s",
                bool(d["all_delivered"]),
                _limit("scale_all", bool(d["all_delivered"]), values),
            )
        )
    lines = ["| target | figure | | what limits it |", "|---|---|---|---|"]
    for name, figure, met, why in rows:
        lines.append(f"| {name} | {figure} | {_mark(met)} | {why} |")
    return lines


def scale_memory(res: dict[str, Any]) -> dict[str, Any]:
    """Broker memory and disk against pending messages, read from the scale snapshots.

    The quorum WAL keeps its entries in memory (ETS tables and the bodies as binaries)
    until it rolls over, then frees them: growth from the 0 snapshot depends on where the
    rollovers fell. So the slopes are fitted over the second half of the fill (least
    squares), and every drop of RSS between snapshots is reported as a rollover.
    """
    snaps = sorted((int(k), v) for k, v in res["snapshots"].items() if k.isdigit())
    n = res["params"]["messages"]
    half = [(k, v) for k, v in snaps if k >= n // 2]

    def slope(key: str) -> float | None:
        pts = [(k, v.get(key)) for k, v in half if v.get(key) is not None]
        if len(pts) < 2:
            return None
        mx = sum(k for k, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        den = sum((k - mx) ** 2 for k, _ in pts)
        return sum((k - mx) * (y - my) for k, y in pts) / den if den else None

    rss = [(k, v.get("mem_rss_bytes") or 0) for k, v in snaps]
    drops = [(k, a - b) for (_, a), (k, b) in itertools.pairwise(rss) if a - b > 16 * 2**20]
    return {
        "rss_slope": slope("mem_rss_bytes"),
        "wal_slope": (slope("mem_quorum_ets_bytes") or 0) + (slope("mem_binary_bytes") or 0),
        "procs_slope": slope("mem_quorum_procs_bytes"),
        "disk_slope": slope("disk_quorum_dir_allocated_bytes"),
        "peak_rss": max((v for _, v in rss), default=None),
        "rollovers": drops,
    }


def _early_total(*docs: dict[str, Any] | None) -> int | None:
    total, seen = 0, False
    e2e, radix, peers, seeds, scale = docs
    if e2e:
        seen = True
        total += sum(r["early_total"] for r in e2e["results"]["rates"].values())
        total += int((e2e["results"].get("saturation") or {}).get("early_total") or 0)
    if radix:
        seen = True
        for c in radix["results"]["configs"].values():
            total += int(c["steady"]["early_total"] or 0)
            total += int((c.get("saturation") or {}).get("early_total") or 0)
    if peers:
        for name, d in peers["results"]["designs"].items():
            if name.startswith("rmqdelay") and "early_total" in (d.get("steady") or {}):
                seen = True
                total += int(d["steady"]["early_total"] or 0)
    if seeds:
        for name, d in seeds["results"].items():
            if name.startswith("rmqdelay") and "stats" in d:
                seen = True
                total += int(d["stats"]["early"] or 0)
    if scale:
        seen = True
        total += int(scale["results"]["drain"]["lateness"]["early"] or 0)
    return total if seen else None


def publish_table(results: Path) -> list[str]:
    doc = load(results, "publish")
    if not doc:
        return []
    r = doc["results"]
    lines = [
        f"**Delayed publish with confirms** ({r['count']:,} messages, delays 10 min to 1 h, "
        f"{r['queue_type']}, window {r['window']}, median of {r['repeats']}, alternating in one "
        "run):",
        "",
        "| publisher | msgs/s | ratio | to | client CPU µs/msg | broker CPU µs/msg "
        "| runs, msgs/s |",
        "|---|---|---|---|---|---|---|",
    ]
    ref_of = r.get("reference_of") or {}
    for name, median in r["median"].items():
        runs = ", ".join(fmt(v) for v in r["rates"][name])
        cpu = (r.get("client_cpu_us_per_msg_median") or {}).get(name)
        broker = (r.get("broker_cpu_us_per_msg_median") or {}).get(name)
        reference = ref_of.get(name, "raw aio-pika")
        to = "—" if reference == name else reference
        lines.append(
            f"| {name} | {fmt(median)} | {ratio(r['ratio'][name])} | {to} | {fmt(cpu)} | "
            f"{fmt(broker)} | {runs} |"
        )
    lines += [
        "",
        "References publish into one plain queue: raw pika with pipelined confirms (for the "
        "sync publisher), raw aio-pika (for the async one) and raw pika waiting for each "
        f"confirm (for a single `publish()`, {fmt(r.get('single_count'))} messages). The "
        "`diag:` rows split a gap: raw pika sending rmqdelay's own messages (planned "
        "beforehand) into the tiers is the broker's cost of the tiers; rmqdelay with delay 0 "
        "(straight to one work queue) is its client work without the tiers. Broker CPU is "
        "the broker process's CPU during the run minus its background just before.",
    ]
    return lines


def startup_table(results: Path) -> list[str]:
    doc = load(results, "startup")
    if not doc:
        return []
    rows, shown = doc["results"], doc["params"]["commands"]
    reference = doc["params"].get("reference_ms_of_targets")
    lines = [
        f"**Start-up** (fresh processes, median of {doc['params']['repeats']}; the targets were "
        f"set where `import pika` took {fmt(reference)} ms, so each is also judged as a ratio "
        "to `import pika` measured here in the same run):",
        "",
        "| command | ms | x `import pika` | before (the issue's machine), ms | target |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        target = ""
        if "target_ms" in row:
            verdict = "met" if row["meets_target_ratio"] else "missed"
            target = f"{fmt(row['target_ms'])} ms = {row['target_ratio']:.2f} x: {verdict}"
        lines.append(
            f"| `{shown[name]}` | {fmt(row['median_ms'])} | {row['ratio_to_reference']:.2f} | "
            f"{fmt(row.get('before_ms'))} | {target} |"
        )
    floor, publish = rows.get("floor"), rows.get("publish")
    if floor and publish and "target_ratio" in publish:
        lines += [
            "",
            "The two rows without rmqdelay's code are what its libraries cost on their own: "
            "importing click, pika and pydantic-settings (the settings), and the floor of any "
            "`publish` command built on them (those imports, a connection, one confirmed "
            f"publish, the close): {floor['ratio_to_reference']:.2f} x `import pika`, against "
            f"the bound of {publish['target_ratio']:.2f} x. `rmqdelay publish` adds "
            f"{fmt(publish['median_ms'] - floor['median_ms'])} ms to that floor (the settings "
            "model and its validation, rmqdelay's own modules).",
        ]
    return lines


def e2e_table(results: Path) -> list[str]:
    doc = load(results, "e2e")
    if not doc:
        return []
    r, p = doc["results"], doc["params"]
    limit = r["plain_limit"]
    lines = [
        f"**End to end** (radix 16, 10 ms, quorum; delays {p['delay_ms'][0] / 1000:g} to "
        f"{p['delay_ms'][1] / 1000:g} s; each rate {p['duration_s']:g} s of due messages; the "
        f"real `rmqdelay.Worker` in its own process; median of {p['repeats']} runs). "
        f"Reference: the plain quorum queue, publish and consume, "
        f"**{fmt(limit.get('publish_consume_rate_per_s'))} msgs/s** (median of "
        f"{limit.get('runs', '?')}); its publish-to-consume latency at the same rate.",
        "",
        "| due per second | lateness p50 / p99 / max, ms | plain latency p50 / p99 / max | "
        "ratio p99 | early | delivered/s | ratio to limit | mean hops |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = list(r["rates"].items())
    if r.get("saturation"):
        rows.append((f"{r['saturation']['rate_per_s']} (the limit)", r["saturation"]))
    for rate, e in rows:
        ref = r["plain_latency"].get(rate)
        ratio_p99 = (e.get("ratio_to_plain_latency") or {}).get("p99_ms")
        label = (
            f"{float(rate):g}"
            if isinstance(rate, str) and rate[0].isdigit() and "(" not in rate
            else rate
        )
        lines.append(
            f"| {label} | {lat(e)} | {lat(ref)} | {ratio(ratio_p99)} | {e['early_total']} | "
            f"{fmt(e['delivered_per_s'])} | {ratio(e.get('ratio_to_plain_limit'))} | "
            f"{fmt(e['mean_hops'], 2)} |"
        )
    return lines


def designs_table(results: Path) -> list[str]:
    peers, seeds = load(results, "peers"), load(results, "seeds")
    if not peers:
        return []
    p = peers["params"]
    extras = peers["results"]["extras"]
    ref_pub = (extras.get("plain_publish_only") or {}).get("publish_rate_per_s")
    lines = [
        f"**Designs side by side**, same broker and machine: the seeds' scenario (5, 4, 3, 2, "
        f"1 s published in that order), confirmed publish of {p['publish_n']:,} messages "
        f"(median of {p['repeats']}; reference: plain queue with no consumer, "
        f"{fmt(ref_pub)} msgs/s), and {p['rate']:g} msgs/s falling due for "
        f"{p['duration_s']:g} s with delays {p['delay_ms'][0] / 1000:g} to "
        f"{p['delay_ms'][1] / 1000:g} s (median of {p['steady_repeats']}; reference: the plain "
        "queue's latency at the same rate).",
        "",
        "| design | seeds arrive (s) | seeds lateness max, ms | publish msgs/s | ratio | "
        "lateness p50 / p99 / max, ms | ratio p99 | early | missing |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    seed_results = seeds["results"] if seeds else {}
    for name, d in peers["results"]["designs"].items():
        sd = seed_results.get(name) or {}
        if "arrival_order" in sd:
            order = ",".join(m.split("-")[1].rstrip("s") for m in sd["arrival_order"])
            seed_max = fmt(sd["stats"]["max_ms"])
        elif "error" in sd:
            order, seed_max = "error", "-"
        else:
            order, seed_max = "n/a", "-"
        pr = d.get("publish_rate") or {}
        st = d.get("steady") or {}
        if "error" in st:
            cells = "error | - | - | -"
        else:
            r99 = (d.get("lateness_ratio_to_plain_latency") or {}).get("p99_ms")
            cells = (
                f"{lat(st)} | {ratio(r99)} | {st.get('early_total', '-')} | "
                f"{st.get('missing_total', '-')}"
            )
        lines.append(
            f"| {d['name']} | {order} | {seed_max} | {fmt(pr.get('publish_rate_per_s'))} | "
            f"{ratio(d.get('publish_ratio_to_plain'))} | {cells} |"
        )
    lines += ["", "How each design was run:", ""]
    for name, d in peers["results"]["designs"].items():
        lines.append(f"- **{d['name']}**: {HOW_RUN.get(name, d['description'])}.")
    kill9 = extras.get("redis_kill9") or []
    if kill9:
        parts = [f"{k['mode']} lost {k['lost']:,} of {k['written']:,}" for k in kill9]
        lines.append(
            "- Redis `kill -9` right after the last acknowledged write, restarted from the same "
            f"directory: {'; '.join(parts)} (a process crash; data already written to the AOF "
            "sits in the page cache and survives; a power loss could lose up to 1 s with "
            "everysec)."
        )
    dram = extras.get("dramatiq")
    if dram:
        m, ct = dram["memory"], dram["consumer_timeout"]
        heap = m.get("python_heap_bytes_per_held_message")
        lines.append(
            f"- dramatiq-style worker holding {m['held_unacked']:,} unacked delayed messages: "
            f"{fmt(heap)} B of Python heap per message ({fmt(m['bytes_per_held_message'])} B "
            f"by RSS); only `prefetch` ({m['prefetch']:,}) can be held. Broker "
            f"`consumer_timeout` = {fmt(ct['consumer_timeout_ms'])} ms ({ct['source']}): a "
            "delay longer than that closes the worker's channel and every held message is "
            "redelivered. Not demonstrated live (it takes 30 min or changing the shared broker)."
        )
    lines.append(
        "- Could not run here: dramatiq itself (not installed: the reimplementation above "
        "stands in) and a Celery worker (only kombu's transport runs, so the table shows what "
        "the cascade delivers, before Celery's worker would hold early messages until eta)."
    )
    return lines


def radix_table(results: Path) -> list[str]:
    doc = load(results, "radix")
    if not doc:
        return []
    r, p = doc["results"], doc["params"]
    lines = [
        f"**Radix and named tiers** ({p['rate']:g} msgs/s due, the e2e workload, median of "
        f"{p['repeats']}; saturation: offered the plain limit, "
        f"{fmt(r.get('plain_limit_per_s'))} msgs/s; ratios to radix 16 in the same run):",
        "",
        "| layout | tier queues | mean hops (measured) | hops for one "
        f"{p['named_tier']} delay | lateness p50 / p99 / max, ms | ratio p99 | "
        "delivered/s at saturation | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, c in r["configs"].items():
        st, rat = c["steady"], c.get("ratio_to_radix16") or {}
        sat = c.get("saturation") or {}
        lines.append(
            f"| {label} | {c['tiers']} | {fmt(st['mean_hops'], 2)} | "
            f"{fmt(c['planned_hops_named_delay'])} | {lat(st)} | {ratio(rat.get('p99_ms'))} | "
            f"{fmt(sat.get('delivered_per_s'))} | "
            f"{ratio(rat.get('saturation_delivered_per_s'))} |"
        )
    return lines


def scale_table(results: Path) -> list[str]:
    doc = load(results, "scale")
    if not doc:
        return []
    r = doc["results"]
    n = r["params"]["messages"]
    lines = [
        f"**Scale**: {n:,} pending delayed messages (quorum, radix 16, 10 ms), published with "
        f"`{r['params']['publisher']}` `publish_many` in chunks of {r['params']['chunk']:,}, all "
        f"due {r['params']['margin_s']:g} s after the fill ends (fill: "
        f"{fmt(r['fill']['seconds'])} s, {fmt(r['fill']['rate_per_s'])} msgs/s, "
        f"{fmt(r['fill']['hops']['mean_hops'], 2)} hops per message). Broker figures are "
        "node-wide (a shared broker; the 0 row is what the node held before). Publish rate: "
        "median of the 3 chunks at that level; reference: raw aio-pika into a plain quorum "
        "queue, measured at 0 and at N pending.",
        "",
        "| pending | publish msgs/s | reference | ratio | broker RSS | WAL in memory (quorum "
        "ETS + binaries) | quorum queue processes | quorum data dir |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def mib(value: Any) -> str:
        return fmt((value or 0) / 2**20, 0, " MiB") if value is not None else "-"

    for level in sorted(r["at_levels"], key=int):
        e = r["at_levels"][level]
        snap = r["snapshots"].get(level) or r["snapshots"].get(str(int(level))) or {}
        wal = (snap.get("mem_quorum_ets_bytes") or 0) + (snap.get("mem_binary_bytes") or 0)
        lines.append(
            f"| {int(level):,} | {fmt(e['publish_rate_per_s'])} | "
            f"{fmt(e['reference_rate_per_s'])} | {ratio(e['ratio_to_reference'])} | "
            f"{mib(snap.get('mem_rss_bytes'))} | {mib(wal)} | "
            f"{mib(snap.get('mem_quorum_procs_bytes'))} | "
            f"{mib(snap.get('disk_quorum_dir_allocated_bytes'))} |"
        )
    mem = scale_memory(r)
    drops = ", ".join(f"{d / 2**20:,.0f} MiB at {k:,}" for k, d in mem["rollovers"]) or "none"
    lines += [
        "",
        f"Fitted over the second half of the fill, per pending message: the quorum WAL's "
        f"in-memory entries (ETS + binaries, freed when the WAL rolls over) "
        f"{fmt(mem['wal_slope'])} B, the queues' own state {fmt(mem['procs_slope'])} B, broker "
        f"RSS {fmt(mem['rss_slope'])} B (it reuses what the rollovers freed; RSS drops: "
        f"{drops}); disk {fmt(mem['disk_slope'])} B. See [scale.png]({_rel(results)}/scale.png).",
    ]
    d = r["drain"]
    lines += [
        "",
        f"Drain: {d['delivered_unique']:,} of {n:,} delivered by the rmqdelay Worker "
        f"({d['missing']} missing, {d['duplicates']} duplicates, {d['lateness']['early']} "
        f"early) in {fmt(d['seconds'])} s after the first due time: **{fmt(d['rate_per_s'])} "
        f"msgs/s** ({ratio(d.get('ratio_to_reference_publish'))} x the raw publish "
        f"reference). They all fell due at once, so lateness grows with the backlog: p50 "
        f"{fmt(d['lateness']['p50_ms'] / 1000, 1)} s, max "
        f"{fmt(d['lateness']['max_ms'] / 1000, 1)} s.",
    ]
    return lines


def _rel(results: Path) -> Path:
    resolved = results.resolve()
    return resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else results


def section(results: Path) -> str:
    docs = [load(results, w) for w in ("publish", "e2e", "peers", "radix", "seeds", "scale")]
    present = [d for d in docs if d]
    if not present:
        return "No results yet: run `make bench`.\n"
    newest = max(d["generated_at_ms"] for d in present)
    m, b = present[0]["machine"], present[0]["broker"]
    when = time.strftime("%Y-%m-%d", time.gmtime(newest / 1000))
    rel = _rel(results)
    suite = results / "suite.json"
    took = ""
    if suite.exists():
        doc = json.loads(suite.read_text(encoding="utf-8"))
        ran = [name for name, w in doc.get("workloads", {}).items() if w.get("ok")]
        minutes = fmt((doc.get("total_seconds") or 0) / 60, 0)
        took = f" The last run ({', '.join(ran)}) took {minutes} min."
        older = [
            p.stem
            for p in sorted(results.glob("*.json"))
            if p.stem not in ran
            and p.stem in {"startup", "publish", "e2e", "radix", "peers", "seeds", "scale"}
        ]
        if older:
            took += f" The {', '.join(older)} figures come from an earlier run of the suite."
    out: list[str] = [
        f"Measured {when} on {m.get('cpu_count')} cores ({m.get('cpu_model')}), "
        f"{fmt((m.get('mem_total_mb') or 0) / 1024, 0)} GiB, {b.get('product')} "
        f"{b.get('version')} ({b.get('platform')}), Python {m.get('python')}; broker, "
        "clients, workers and Redis share the 2 cores. `make bench` (`python -m bench`) runs "
        f"everything and writes `{rel}/*.json` (machine, broker, every parameter, every run) "
        "and the plots; `python -m bench report` regenerates this section. Every timing is a "
        "median over repeated runs with its ratio to a reference measured in the same run."
        f"{took} See [bench/README.md](bench/README.md) for the method and what limits each "
        "figure.",
        "",
        *targets(results),
        "",
        f"![Lateness CDF per design]({rel}/lateness_cdf.png)",
        "",
        *designs_table(results),
        "",
        *publish_table(results),
        "",
        *startup_table(results),
        "",
        *e2e_table(results),
        "",
        f"![Throughput]({rel}/throughput.png)",
        "",
        *radix_table(results),
        "",
        *scale_table(results),
        "",
        f"More plots: [lateness per rate]({rel}/e2e_lateness.png), [radix]({rel}/radix.png), "
        f"[scale]({rel}/scale.png).",
    ]
    return "\n".join(out).replace("\n\n\n", "\n\n") + "\n"


def update_readme(readme: Path, body: str) -> bool:
    text = readme.read_text(encoding="utf-8")
    if START not in text or END not in text:
        print(f"{readme}: no {START} / {END} markers; not updated", file=sys.stderr)
        return False
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{START}\n{body}{END}{tail}", encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench report", description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=RESULTS_DIR)
    p.add_argument("--readme", type=Path, default=README)
    p.add_argument("--no-readme", action="store_true", help="only draw the plots")
    p.add_argument("--print", action="store_true", help="print the section to stdout")
    args = p.parse_args(argv)
    for path in plots.draw_all(args.results):
        print(f"drew {path}", file=sys.stderr)
    body = section(args.results)
    if args.print:
        print(body)
    if not args.no_readme and update_readme(args.readme, body):
        print(f"updated {args.readme} (Performance section)", file=sys.stderr)
    return 0
