"""This tree's rmqdelay against a git revision's, side by side in one run.

    python -m bench compare fd87b58                 # make bench-compare BENCH_BASE=fd87b58
    python -m bench compare main --rounds 5 --keys publish.sync.many.long,worker.drain.noop

The revision is checked out in a temporary git worktree. Each round runs the measures of
:mod:`bench.measures` (by default :data:`bench.measures.COMPARED`: publish sync many
long/short, async many, one ``publish()``, the worker's drain, and raw pika as a gauge of
the machine's noise) once in a fresh process per tree, the order alternating between
rounds. Only ``PYTHONPATH`` differs between the two: this tree's bench package first, then
the tree whose ``rmqdelay`` is measured (each child prints the ``rmqdelay`` it imported).
Prints each key's median per tree, the ratio this / base, and each tree's median client
CPU per message (steadier than the rate on a shared machine); ``--out`` keeps the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_AMQP_URL
from bench.measures import BY_KEY, COMPARED

ROOT = Path(__file__).resolve().parent.parent


def _child(
    tree: Path, bench_only: Path, args: argparse.Namespace, keys: list[str]
) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{bench_only}{os.pathsep}{tree}"}
    command = [
        sys.executable,
        "-m",
        "bench.measures",
        "--json",
        "--url",
        args.url,
        "--repeats",
        "1",
        "--count",
        str(args.count),
        "--drain",
        str(args.drain),
        "--keys",
        ",".join(keys),
    ]
    done = subprocess.run(command, env=env, cwd=bench_only, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"measures in {tree} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(result["rmqdelay"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(
            f"expected rmqdelay from {tree}, the child imported {result['rmqdelay']}"
        )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench compare", description=__doc__)
    parser.add_argument("base", help="a git revision of this repository (e.g. main, fd87b58)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--drain", type=int, default=20_000)
    parser.add_argument("--keys", default=",".join(COMPARED))
    parser.add_argument("--url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--out", type=Path, help="also write every run as JSON here")
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.keys.split(",") if k.strip()]
    if unknown := [k for k in keys if k not in BY_KEY]:
        parser.error(f"unknown keys {unknown}; known: {', '.join(BY_KEY)}")
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.base],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        base_tree, bench_only = Path(tmp) / "base", Path(tmp) / "bench-only"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(base_tree), rev],
            check=True,
        )
        try:
            bench_only.mkdir()
            (bench_only / "bench").symlink_to(ROOT / "bench")
            trees = {"this": ROOT, "base": base_tree}
            runs: dict[str, dict[str, list[float]]] = {t: {k: [] for k in keys} for t in trees}
            cpu: dict[str, dict[str, list[float]]] = {t: {k: [] for k in keys} for t in trees}
            for round_ in range(args.rounds):
                order = ["this", "base"] if round_ % 2 == 0 else ["base", "this"]
                for name in order:
                    result = _child(trees[name], bench_only, args, keys)
                    for key in keys:
                        runs[name][key].append(result["figures"][key]["value"])
                        cpu[name][key].append(result["figures"][key]["client_cpu_us"])
                    print(f"round {round_ + 1}/{args.rounds} {name}: done", file=sys.stderr)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)],
                check=False,
            )
    print(f"this tree ({ROOT}) against {args.base} ({rev}), {args.rounds} rounds, alternating")
    print(
        f"{'key':28} {'this':>9} {'base':>9} {'this/base':>9}  client µs/msg this base"
        "  runs this | base"
    )
    table: dict[str, Any] = {}
    for key in keys:
        this, base = statistics.median(runs["this"][key]), statistics.median(runs["base"][key])
        # client CPU per message: steadier than the rate on a shared machine
        this_cpu, base_cpu = (statistics.median(cpu[t][key]) for t in ("this", "base"))
        table[key] = {"this": this, "base": base, "ratio": round(this / base, 3), "unit": "msgs/s"}
        table[key] |= {"client_cpu_us": {"this": this_cpu, "base": base_cpu}}
        spread = " ".join(f"{v:,.0f}" for v in runs["this"][key]) + " | "
        spread += " ".join(f"{v:,.0f}" for v in runs["base"][key])
        print(
            f"{key:28} {this:9,.0f} {base:9,.0f} {this / base:9.2f}  "
            f"{this_cpu:8.1f} {base_cpu:5.1f}  {spread}"
        )
    if args.out:
        doc = {"base": args.base, "rev": rev, "rounds": args.rounds, "count": args.count}
        doc |= {"drain": args.drain, "figures": table, "runs": runs, "client_cpu_us": cpu}
        args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
