"""The Performance page's figures (docs/performance.md) are the rendering of the bench's
keyed figures.

``bench/report.py`` fills ``bench/performance.md`` from ``bench.keys`` (the results' JSON
files as short keys): a hand edit of a figure on the page, or a template naming a key
that no longer exists, fails here. Also the template language itself, on a small input.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench import keys, report

ROOT = Path(__file__).resolve().parents[2]


def test_the_page_is_the_rendering_of_the_committed_results() -> None:
    text = report.PAGE.read_text(encoding="utf-8")
    current = text.split(report.START, 1)[1].split(report.END, 1)[0].removeprefix("\n")
    doc = keys.collect(keys.RESULTS_DIR)
    assert current == report.render(report.TEMPLATE.read_text(encoding="utf-8"), doc), (
        "docs/performance.md differs from `python -m bench report --no-plots`"
    )


def test_every_key_the_template_names_exists() -> None:
    template = report.TEMPLATE.read_text(encoding="utf-8")
    lines = []
    for line in template.splitlines():  # expand the row loops first
        loop = report.LOOP.search(line)
        words = loop["words"].split() if loop else [""]
        lines += [line[: loop.start()].replace("@", w) if loop else line for w in words]
    named = {m["key"] for m in report.PLACEHOLDER.finditer("\n".join(lines))} - {"measured"}
    missing = named - set(keys.collect(keys.RESULTS_DIR)["figures"])
    assert not missing, f"the template names keys no result gives: {sorted(missing)}"


def test_placeholders_fields_marks_and_loops() -> None:
    doc = {
        "measured": {"publish": {"date": "2026-01-02", "machine": {}, "broker": {}}},
        "figures": {
            "a.x": keys.fig(12345.6, "msgs/s", ratio=0.876, runs=[1.0, 2000.4]),
            "a.y": keys.fig(2.5, "hops", text="words"),
        },
    }
    template = (
        "{a.x} {a.x|ratio} {a.x|ratio>=0.9} {a.x|value>=100} {a.x|runs} {a.x:1}\n"
        "| {a.@|text} | {a.@} | <!-- @ x y -->\n{missing.key} {measured}"
    )
    out = report.render(template, doc).splitlines()
    assert out[0] == "12,346 0.88 **not met** **met** 1, 2,000 12,345.6"
    assert out[1:3] == ["| - | 12,346 |", "| words | 2.50 |"]
    assert re.match(r"- Measured publish on 2026-01-02, ", out[3])


def test_engine43_figures_take_their_ratios_to_the_tiers_of_the_same_run() -> None:
    tiers = {
        "p50_ms": 20.0,
        "p99_ms": 100.0,
        "max_ms": 150.0,
        "early": 0,
        "missing": 0,
        "broker_cpu_ms_per_msg": 2.0,
        "worker_cpu_ms_per_msg": 1.0,
        "scheduler_cpu_ms_per_msg": None,
    }
    deferred = {
        **tiers,
        "p99_ms": 50.0,
        "early": 1,
        "broker_cpu_ms_per_msg": 1.0,
        "scheduler_cpu_ms_per_msg": 0.5,
        "at_scheduler": {"early": 0, "p50_ms": 5.0, "p99_ms": 9.0, "max_ms": 12.0},
    }
    doc = {
        "broker": {"version": "4.3.6"},
        "load_before": {"loadavg": [1.5, 1.0, 1.0]},
        "params": {"repeats": 3, "duration": 10.0},
        "results": {
            "medians": {
                "load.r250": {"tiers": tiers, "deferred": deferred},
                "memory": {
                    "deferred": {
                        "waiting": 10,
                        "erlang_bytes_per_msg": 2000.0,
                        "rss_bytes_per_msg": None,
                        "publish_per_s": 500.0,
                        "deferred_per_s": 480.0,
                    }
                },
            }
        },
    }
    figures = keys.from_engine43(doc)
    assert figures["engine43"]["text"] == "RabbitMQ 4.3.6, load 1.5 before it"
    assert figures["engine43.r250.deferred.p99"] == keys.fig(50.0, "ms", ratio=0.5)
    assert "ratio" not in figures["engine43.r250.tiers.p99"]
    assert figures["engine43.r250.deferred.cpu.broker"]["ratio"] == 0.5
    assert figures["engine43.r250.deferred.sched.p99"]["value"] == 9.0
    assert "engine43.r250.tiers.sched.p99" not in figures
    assert figures["engine43.memory.deferred.rate"]["value"] == 480.0
    # only the tiers' early count joins all.early: the deferred design is not rmqdelay's
    assert list(keys._early(figures)) == [0]
