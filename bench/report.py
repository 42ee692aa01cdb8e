"""The docs' Performance page (docs/performance.md), rendered from the keyed figures, and
the plots.

    python -m bench report                  # figures.json (made from results/*.json first)
    python -m bench report --print --no-page
    python -m bench report --check          # exit 1 when the page's section is stale

The section is ``bench/performance.md`` with every figure a placeholder naming its key
(:mod:`bench.keys`), written between ``<!-- performance:start -->`` and
``<!-- performance:end -->`` of the page; nothing else in it is touched. The words around the
figures (what limits each one) are the template's: after a run that changes what they
explain, edit them there.

Placeholders: ``{key}`` the value; ``{key|field}`` another field (``ratio``, ``runs``,
``text``, ``client_cpu_us``...); ``{key|ratio>=0.9}`` or ``{key|value<=25}``: **met** or
**not met**; ``:N`` after either, N decimals. A line ending in ``<!-- @ a b c -->`` is
written once per word, ``@`` in its placeholders replaced by the word. ``{measured}``
says when and where.
"""

from __future__ import annotations

import argparse
import json
import operator
import re
import sys
from pathlib import Path
from typing import Any

from bench import keys

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = Path(__file__).resolve().parent / "performance.md"
PAGE = ROOT / "docs" / "performance.md"
START, END = "<!-- performance:start -->", "<!-- performance:end -->"
PLACEHOLDER = re.compile(
    r"\{(?P<key>[a-z0-9_.@-]+)(?:\|(?P<field>[a-z_]+)(?:(?P<op>[<>=]=)(?P<bound>[\d.]+))?)?"
    r"(?::(?P<nd>\d))?\}"
)
LOOP = re.compile(r"\s*<!-- @ (?P<words>[^>]*) -->$")
TWO_DECIMALS = {"hops", "ratio", "GiB"}
OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq}


def number(value: Any, nd: int) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return f"{value:,.{nd}f}"
    return str(value)


def render_one(match: re.Match[str], figures: keys.Figures) -> str:
    key, field = match["key"], match["field"] or "value"
    figure = figures.get(key)
    if figure is None:
        return "-"
    value = figure.get(field)
    if match["op"]:
        if value is None:
            return "not run"
        met = OPS[match["op"]](value, float(match["bound"]))
        return "**met**" if met else "**not met**"
    default = 2 if field == "ratio" or figure.get("unit") in TWO_DECIMALS else 0
    nd = int(match["nd"]) if match["nd"] else default
    if isinstance(value, list):
        return ", ".join(number(v, nd) for v in value)
    return number(value, nd)


def _load(load: dict[str, Any] | None) -> str:
    """How busy the machine was just before the workload ran: beside its figures."""
    if not load or not load.get("loadavg"):
        return ""
    busy = load.get("busy_percent", "?")
    return f" (machine {busy} % busy before, load {load['loadavg'][0]:.1f})"


def measured(doc: dict[str, Any]) -> str:
    by_date: dict[str, list[str]] = {}
    for workload, where in doc["measured"].items():
        by_date.setdefault(where["date"], []).append(workload + _load(where.get("load_before")))
    dates = "; ".join(f"{', '.join(w)} on {d}" for d, w in sorted(by_date.items(), reverse=True))
    # engine43 runs on RabbitMQ 4.3 (its table says so): the header names the suite's broker
    suite = {w: v for w, v in doc["measured"].items() if w != "engine43"} or doc["measured"]
    last = max(suite.values(), key=lambda where: str(where["date"]))
    m, b = last.get("machine") or {}, last.get("broker") or {}
    return (
        f"Measured {dates}, on {m.get('cpu_count')} cores ({m.get('cpu_model')}), "
        f"{(m.get('mem_total_mb') or 0) / 1024:.0f} GiB, {b.get('product')} {b.get('version')} "
        f"({b.get('platform')}), Python {m.get('python')}"
    )


def render(template: str, doc: dict[str, Any]) -> str:
    figures = doc["figures"]
    lines: list[str] = []
    for line in template.splitlines():
        loop = LOOP.search(line)
        if loop:
            body = line[: loop.start()]
            lines += [body.replace("@", word) for word in loop["words"].split()]
        else:
            lines.append(line)
    text = "\n".join(lines).replace("{measured}", measured(doc))
    return PLACEHOLDER.sub(lambda m: render_one(m, figures), text).strip() + "\n"


def section(results: Path) -> str:
    doc = keys.collect(results)
    (results / "figures.json").write_text(
        json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8"
    )
    template = TEMPLATE.read_text(encoding="utf-8")
    if not doc["figures"]:
        return "No results yet: run `make bench`.\n"
    return render(template, doc)


def update_page(page: Path, body: str) -> bool:
    text = page.read_text(encoding="utf-8")
    if START not in text or END not in text:
        print(f"{page}: no {START} / {END} markers; not updated", file=sys.stderr)
        return False
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    page.write_text(f"{head}{START}\n{body}{END}{tail}", encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench report", description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=keys.RESULTS_DIR)
    p.add_argument("--page", type=Path, default=PAGE, help="the page holding the markers")
    p.add_argument("--no-page", action="store_true", help="leave the page alone")
    p.add_argument("--no-plots", action="store_true", help="draw no plot (no matplotlib needed)")
    p.add_argument("--print", action="store_true", help="print the section to stdout")
    p.add_argument("--check", action="store_true", help="exit 1 if the page's section differs")
    args = p.parse_args(argv)
    if args.check:
        text = args.page.read_text(encoding="utf-8")
        current = text.split(START, 1)[1].split(END, 1)[0].removeprefix("\n")
        same = current == render(TEMPLATE.read_text(encoding="utf-8"), keys.collect(args.results))
        print("the Performance page's section is " + ("current" if same else "stale"))
        return 0 if same else 1
    if not args.no_plots:
        from bench import plots

        for path in plots.draw_all(args.results):
            print(f"drew {path}", file=sys.stderr)
    body = section(args.results)
    if args.print:
        print(body)
    if not args.no_page and update_page(args.page, body):
        print(f"updated {args.page} (Performance section)", file=sys.stderr)
    return 0
