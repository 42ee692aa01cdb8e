"""PNG plots from bench/results/*.json (matplotlib, no display needed).

    python -m bench report            # draws these and regenerates docs/performance.md

* ``lateness_cdf.png``: lateness CDF per design on the steady workload (peers.json).
* ``throughput.png``: confirmed publish rate per design; rmqdelay's publishers against raw
  aio-pika; end-to-end delivered per second against the plain-queue limit.
* ``e2e_lateness.png``: rmqdelay lateness p50/p99/max per due rate, with the plain latency.
* ``radix.png``: hops, lateness and saturated delivery per radix / named tier.
* ``scale.png``: publish rate, broker memory and disk against pending messages; the drain.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from bench.common import QUANTILE_GRID

#: One colour per design family, stable across plots.
COLORS = {
    "rmqdelay": "#1f77b4",
    "plain": "#7f7f7f",
    "naive": "#d62728",
    "kombu-cascade": "#ff7f0e",
    "kombu-cascade-ceil": "#e3a857",
    "dramatiq-style": "#9467bd",
    "redis-off": "#2ca02c",
    "redis-everysec": "#55c155",
    "redis-always": "#98df8a",
    "rmqdelay-sync": "#17becf",
}


#: The publish panel: each rmqdelay publisher beside its reference (keys of bench.measures).
PUBLISH_PANEL = {
    "publish.raw.pika.many": ("raw pika", "#7f7f7f"),
    "publish.sync.many.long": ("rmqdelay\nsync", "#17becf"),
    "publish.raw.aiopika.many": ("raw\naio-pika", "#7f7f7f"),
    "publish.async.many.long": ("rmqdelay\nasync", "#1f77b4"),
    "publish.raw.pika.single": ("raw pika,\none at\na time", "#7f7f7f"),
    "publish.sync.single": ("rmqdelay\npublish()", "#17becf"),
}


def load(results: Path, workload: str) -> dict[str, Any] | None:
    path = results / f"{workload}.json"
    if not path.exists():
        return None
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


def _subtitle(doc: dict[str, Any]) -> str:
    m, b = doc.get("machine", {}), doc.get("broker", {})
    return (
        f"{b.get('product', 'RabbitMQ')} {b.get('version', '?')}, {m.get('cpu_count', '?')} cores "
        f"({m.get('cpu_model', '?')}), Python {m.get('python', '?')}"
    )


def _save(fig: Any, path: Path) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def lateness_cdf(results: Path) -> Path | None:
    doc = load(results, "peers")
    if doc is None:
        return None
    params = doc["params"]
    fig, ax = plt.subplots(figsize=(10, 5.6))
    ys = [q / 100 for q in QUANTILE_GRID]
    for name, entry in doc["results"]["designs"].items():
        steady = entry.get("steady") or {}
        qs = steady.get("lateness_quantiles")
        if not qs:
            continue
        is_plain = not entry.get("supports_delay", True)
        label = entry["name"] + (" (latency: no delay, the reference)" if is_plain else "")
        ax.plot(
            qs,
            ys,
            label=label,
            color=COLORS.get(name),
            linewidth=2.6 if name == "rmqdelay" else 1.5,
            linestyle="--" if is_plain else "-",
        )
    resolution = 10
    ax.axvline(resolution + 15, color="k", linewidth=0.8, linestyle=":")
    ax.text(resolution + 15, 0.5, " target p99 ≤ 25 ms", fontsize=8, rotation=90, va="center")
    ax.axvline(0, color="k", linewidth=0.8)
    ax.set_xscale("symlog", linthresh=10, linscale=0.6)
    ax.set_xlabel("lateness, ms (received - due; negative = early)  [symlog]")
    ax.set_ylabel("fraction of messages")
    ax.set_ylim(0, 1.0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    delays = params.get("delay_ms", ["?", "?"])
    ax.set_title(
        f"Lateness CDF: {params.get('rate', '?'):g} msgs/s falling due for "
        f"{params.get('duration_s', '?')} s, delays {delays[0] / 1000:g}-{delays[1] / 1000:g} s, "
        f"{params.get('steady_repeats', '?')} runs pooled\n{_subtitle(doc)}",
        fontsize=10,
    )
    return _save(fig, results / "lateness_cdf.png")


def _bar_labels(ax: Axes, bars: Any, fmt: str = "{:,.0f}") -> None:
    for bar in bars:
        h = bar.get_height()
        if h and h == h:
            ax.annotate(
                fmt.format(h),
                (bar.get_x() + bar.get_width() / 2, h),
                ha="center",
                va="bottom",
                fontsize=7,
            )


def throughput(results: Path) -> Path | None:
    peers, publish, e2e = (load(results, w) for w in ("peers", "publish", "e2e"))
    panels = [p for p in (peers, publish, e2e) if p is not None]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 5.0), squeeze=False)
    i = 0
    if peers is not None:
        ax = axes[0][i]
        i += 1
        names, values, colors = [], [], []
        for name, entry in peers["results"]["designs"].items():
            rate = (entry.get("publish_rate") or {}).get("publish_rate_per_s")
            if rate:
                names.append(entry["name"])
                values.append(rate)
                colors.append(COLORS.get(name, "#333333"))
        ref = (peers["results"]["extras"].get("plain_publish_only") or {}).get("publish_rate_per_s")
        bars = ax.bar(range(len(values)), values, color=colors)
        _bar_labels(ax, bars)
        if ref:
            ax.axhline(ref, color="k", linestyle="--", linewidth=1)
            ax.text(-0.5, ref, f"plain queue, no consumer: {ref:,.0f}", fontsize=7, va="top")
        ax.set_xticks(range(len(names)), names, rotation=55, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("confirmed publish, msgs/s (log)")
        ax.set_title(
            f"Publish rate per design\n({peers['params']['publish_n']} msgs, median of "
            f"{peers['params']['repeats']})",
            fontsize=9,
        )
    if publish is not None:
        ax = axes[0][i]
        i += 1
        figures, params = publish["results"]["figures"], publish["params"]
        names = [k for k in PUBLISH_PANEL if k in figures]
        values = [figures[k]["value"] for k in names]
        ratios = [figures[k].get("ratio", 1.0) for k in names]
        colors = [PUBLISH_PANEL[k][1] for k in names]
        bars = ax.bar(range(len(names)), values, color=colors)
        for bar, ratio in zip(bars, ratios, strict=True):
            ax.annotate(f"{bar.get_height():,.0f}\nx{ratio:.2f}",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=7)  # fmt: skip
        ax.set_yscale("log")
        ax.set_ylim(top=max(values) * 3)
        ax.set_xticks(range(len(names)), [PUBLISH_PANEL[k][0] for k in names], fontsize=7)
        ax.set_ylabel("msgs/s (log)")
        ax.set_title(
            f"Delayed publish with confirms, against its reference\n({params['count']:,} msgs, "
            f"median of {params['repeats']}, window {params['window']}, {params['queue_type']})",
            fontsize=9,
        )
    if e2e is not None:
        ax = axes[0][i]
        res = e2e["results"]
        limit = res["plain_limit"].get("publish_consume_rate_per_s")
        labels, offered, delivered = [], [], []
        for rate, entry in res["rates"].items():
            labels.append(f"{float(rate):g}/s")
            offered.append(float(rate))
            delivered.append(entry["delivered_per_s"] or 0)
        if res.get("saturation"):
            labels.append(f"saturation\n{res['saturation']['rate_per_s']:,}/s")
            offered.append(res["saturation"]["rate_per_s"])
            delivered.append(res["saturation"]["delivered_per_s"] or 0)
        x = range(len(labels))
        ax.bar([v - 0.2 for v in x], offered, width=0.4, color="#c7c7c7", label="offered (due/s)")
        bars = ax.bar([v + 0.2 for v in x], delivered, width=0.4, color="#1f77b4",
                      label="delivered/s (rmqdelay Worker)")  # fmt: skip
        _bar_labels(ax, bars)
        if limit:
            ax.axhline(limit, color="k", linestyle="--", linewidth=1)
            ax.axhline(limit / 2, color="k", linestyle=":", linewidth=1)
            ax.text(-0.5, limit, f"plain publish+consume limit {limit:,.0f}", fontsize=7,
                    va="bottom")  # fmt: skip
            ax.text(-0.5, limit / 2, "target 50 % of the limit", fontsize=7, va="bottom")
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_ylabel("msgs/s")
        ax.set_ylim(0, max([*offered, limit or 0]) * 1.15)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
        ax.set_title("End to end: delivered per second\n(radix 16, 10 ms, quorum)", fontsize=9)
    fig.suptitle(_subtitle(panels[0]), fontsize=9)
    fig.tight_layout()
    return _save(fig, results / "throughput.png")


def e2e_lateness(results: Path) -> Path | None:
    doc = load(results, "e2e")
    if doc is None:
        return None
    res = doc["results"]
    rates = list(res["rates"])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    x = range(len(rates))
    for k, (key, color) in enumerate(
        (("p50_ms", "#aec7e8"), ("p99_ms", "#1f77b4"), ("max_ms", "#08306b"))
    ):
        values = [res["rates"][r][key] or 0 for r in rates]
        bars = ax.bar([v + (k - 1) * 0.25 for v in x], values, width=0.25, color=color,
                      label=f"rmqdelay {key[:-3]}")  # fmt: skip
        _bar_labels(ax, bars)
        plain = [(res["plain_latency"].get(r) or {}).get(key) or 0 for r in rates]
        ax.scatter([v + (k - 1) * 0.25 for v in x], plain, color="#7f7f7f", marker="_", s=200,
                   zorder=3, label="plain-queue latency" if k == 0 else None)  # fmt: skip
    target = res.get("targets", {}).get("p99_at_500_target_ms")
    if target:
        ax.axhline(target, color="k", linestyle=":", linewidth=1)
        ax.text(-0.45, target, f"target p99 ≤ {target} ms at 500/s", fontsize=7, va="bottom")
    ax.set_xticks(list(x), [f"{float(r):g}/s due" for r in rates])
    ax.set_ylabel("lateness, ms")
    ax.legend(fontsize=8)
    p = doc["params"]
    ax.set_title(
        f"rmqdelay lateness per due rate (median of {p['repeats']} runs, delays "
        f"{p['delay_ms'][0] / 1000:g}-{p['delay_ms'][1] / 1000:g} s)\n{_subtitle(doc)}",
        fontsize=9,
    )
    return _save(fig, results / "e2e_lateness.png")


def radix(results: Path) -> Path | None:
    doc = load(results, "radix")
    if doc is None:
        return None
    configs = doc["results"]["configs"]
    labels = list(configs)
    short = [label.replace("radix 16 + named ", "16+").replace("radix ", "r") for label in labels]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.3))
    x = range(len(labels))
    hops = [configs[c]["steady"]["mean_hops"] or 0 for c in labels]
    planned = [configs[c]["planned_hops_named_delay"] for c in labels]
    bars = axes[0].bar([v - 0.2 for v in x], hops, width=0.4, color="#1f77b4",
                       label="measured, workload")  # fmt: skip
    _bar_labels(axes[0], bars, "{:.2f}")
    bars = axes[0].bar([v + 0.2 for v in x], planned, width=0.4, color="#ff7f0e",
                       label=f"planned, one {doc['params']['named_tier']} delay")  # fmt: skip
    _bar_labels(axes[0], bars, "{:.0f}")
    axes[0].set_title("mean hops per message", fontsize=9)
    axes[0].legend(fontsize=7)
    for k, (key, color) in enumerate((("p50_ms", "#aec7e8"), ("p99_ms", "#1f77b4"))):
        values = [configs[c]["steady"][key] or 0 for c in labels]
        bars = axes[1].bar([v + (k - 0.5) * 0.4 for v in x], values, width=0.4, color=color,
                           label=key[:-3])  # fmt: skip
        _bar_labels(axes[1], bars)
    axes[1].set_title(f"lateness at {doc['params']['rate']:g}/s, ms", fontsize=9)
    axes[1].legend(fontsize=7)
    sat = [(configs[c].get("saturation") or {}).get("delivered_per_s") or 0 for c in labels]
    bars = axes[2].bar(list(x), sat, color="#2ca02c")
    _bar_labels(axes[2], bars)
    limit = doc["results"].get("plain_limit_per_s")
    if limit:
        axes[2].axhline(limit, color="k", linestyle="--", linewidth=1)
        axes[2].text(-0.4, limit, f"plain limit {limit:,.0f}", fontsize=7, va="bottom")
    axes[2].set_title("delivered/s when offered the plain limit", fontsize=9)
    for ax in axes:
        ax.set_xticks(list(x), short, fontsize=8)
    fig.suptitle(f"Radix and named tiers (10 ms, quorum)  —  {_subtitle(doc)}", fontsize=9)
    fig.tight_layout()
    return _save(fig, results / "radix.png")


def scale(results: Path) -> Path | None:
    doc = load(results, "scale")
    if doc is None:
        return None
    res = doc["results"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    chunks = res["fill"]["chunks"]
    xs = [c["pending_after"] / 1000 for c in chunks]
    label = f"rmqdelay {res['params']['publisher']} publish_many, per chunk"
    axes[0].plot(xs, [c["rate_per_s"] for c in chunks], color="#1f77b4", linewidth=1, label=label)
    for key, x0, lab in (("reference_at_0", 0, "at 0"), ("reference_at_n", xs[-1], "at N")):
        ref = res.get(key) or {}
        if ref.get("median"):
            axes[0].scatter([x0], [ref["median"]], color="k", marker="D", zorder=3,
                            label=f"raw aio-pika plain queue {lab}")  # fmt: skip
    axes[0].set_xlabel("pending delayed messages, thousands")
    axes[0].set_ylabel("confirmed publish, msgs/s")
    axes[0].set_ylim(bottom=0)
    axes[0].legend(fontsize=7, loc="lower left")
    axes[0].set_title("publish rate while the tiers fill", fontsize=9)
    snaps = [(int(k), v) for k, v in res["snapshots"].items() if k.isdigit()]
    snaps.sort()
    sx = [k / 1000 for k, _ in snaps]

    def series(*keys: str) -> list[float]:
        return [sum((v.get(key) or 0) for key in keys) / 2**20 for _, v in snaps]

    axes[1].plot(sx, series("mem_rss_bytes"), marker="o", label="broker RSS")
    axes[1].plot(sx, series("mem_quorum_ets_bytes", "mem_binary_bytes"), marker=".",
                 label="quorum WAL in memory (ETS + binaries)")  # fmt: skip
    axes[1].plot(sx, series("mem_quorum_procs_bytes"), marker=".", label="quorum queue processes")
    axes[1].plot(sx, series("disk_quorum_dir_allocated_bytes"), marker="s", linestyle="--",
                 label="quorum data dir on disk (du)")  # fmt: skip
    axes[1].set_xlabel("pending delayed messages, thousands")
    axes[1].set_ylabel("MiB (node-wide, shared broker)")
    axes[1].set_ylim(bottom=0)
    axes[1].legend(fontsize=7)
    axes[1].set_title("broker memory and disk (the WAL frees memory at rollover)", fontsize=9)
    drain = res["drain"]
    per_s = drain["delivered_per_second_after_due"]
    cumulative, total = [], 0
    for v in per_s:
        total += v
        cumulative.append(total / 1000)
    axes[2].plot(range(len(per_s)), cumulative, color="#2ca02c")
    axes[2].set_xlabel("seconds after the first due time")
    axes[2].set_ylabel("delivered, thousands")
    axes[2].set_title(
        f"drain: {drain['delivered_unique']:,} of {res['params']['messages']:,} in "
        f"{drain['seconds']:,.0f} s ({drain['rate_per_s']:,.0f}/s), missing {drain['missing']}",
        fontsize=9,
    )
    fig.suptitle(
        f"Scale: {res['params']['messages']:,} pending delayed messages (quorum, radix 16, 10 ms)"
        f"  —  {_subtitle(doc)}",
        fontsize=9,
    )
    fig.tight_layout()
    return _save(fig, results / "scale.png")


def draw_all(results: Path) -> list[Path]:
    drawn = []
    for fn in (lateness_cdf, throughput, e2e_lateness, radix, scale):
        path = fn(results)
        if path is not None:
            drawn.append(path)
    return drawn
