"""How fast the ``rmqdelay`` command starts: ``python -m bench startup``.

Times, in fresh processes, each command of ``COMMANDS``: ``python -c 'import pika'``
(the reference: what any pika script pays), ``python -c 'import rmqdelay'``,
``rmqdelay --help`` and one real ``rmqdelay publish DEST BODY --delay 10s`` against
``--url`` (default ``BENCH_AMQP_URL``, else ``RMQDELAY_URL``, else the local broker).
Two rows without rmqdelay's code show what its libraries cost on their own: importing
click and pika, and the floor of any publish command built on them
(those imports, a connection, one confirmed publish, the close: ``FLOOR``).
The issue's reference for ``rmqdelay publish`` is a raw pika script (``PIKA_SCRIPT``:
``import pika``, connect, one confirmed publish, close), measured in the same rounds:
each row also gives its ratio to it, and ``publish`` is judged against
``SCRIPT_TARGETS`` (at most 2.0 x the script).
One untimed warm-up round first (the OS file cache, ``__pycache__``), then ``--repeats``
rounds; the commands take turns within a round, so a burst of load elsewhere falls on all
of them. Prints the medians, their ratio to the reference and the targets, and writes
``bench/results/startup.json``.

The targets were set in milliseconds on a machine where the reference took 81 ms; on a
slower or busier machine compare the ratios (target / 81 ms), which the output shows too.
The publish command needs a topology: it is declared with ``rmqdelay topology apply`` under
a fresh prefix (``RMQDELAY_PREFIX``) and destroyed after, whatever happens.

    python -m bench startup                  # all of it
    python -m bench startup --no-publish     # no broker needed
    python -m bench startup --repeats 9 --out /tmp/startup.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_AMQP_URL, machine_info, machine_load, masked, now_ms

RESULTS = Path(__file__).resolve().parent / "results" / "startup.json"
DESTINATION = "startup"
#: what the issue measured before this work (medians of 5, ms), and its reference
BEFORE_MS = {"reference": 81.0, "help": 392.0, "publish": 334.0}
#: the targets (ms, median of 5) on the machine where the reference took REFERENCE_MS
TARGETS_MS = {"help": 150.0, "publish": 200.0}
REFERENCE_MS = BEFORE_MS["reference"]
#: targets as a ratio to the raw pika script of the same run (issue 21: 269 vs 101 ms before)
SCRIPT_TARGETS = {"publish": 2.0}


@dataclass(frozen=True)
class Command:
    name: str
    argv: list[str]
    needs_broker: bool = False


#: The floor of any ``publish`` command on rmqdelay's libraries (pika and click; the
#: settings are plain Python): import them, connect, publish one persistent message with confirms
#: into the destination's work queue, close. No rmqdelay code: what no CLI can go under.
FLOOR = """\
import os, sys
import click, pika
connection = pika.BlockingConnection(pika.URLParameters(os.environ["RMQDELAY_URL"]))
channel = connection.channel()
channel.confirm_delivery()
properties = pika.BasicProperties(delivery_mode=2, message_id="floor")
channel.basic_publish("", sys.argv[1], b"startup bench", properties, mandatory=True)
connection.close()
"""


#: The issue's reference for ``rmqdelay publish``: what a user's own pika script costs to
#: send one message with confirms (the same message properties and queue as ``FLOOR``).
PIKA_SCRIPT = """\
import os, sys
import pika
connection = pika.BlockingConnection(pika.URLParameters(os.environ["RMQDELAY_URL"]))
channel = connection.channel()
channel.confirm_delivery()
properties = pika.BasicProperties(delivery_mode=2, message_id="script")
channel.basic_publish("", sys.argv[1], b"startup bench", properties, mandatory=True)
connection.close()
"""


def commands(python: str, rmqdelay: str, work_queue: str = "") -> list[Command]:
    return [
        Command("reference", [python, "-c", "import pika"]),
        Command("import", [python, "-c", "import rmqdelay"]),
        Command("help", [rmqdelay, "--help"]),
        Command("libraries", [python, "-c", "import click, pika"]),
        Command("floor", [python, "-c", FLOOR, work_queue], needs_broker=True),
        Command("pika_script", [python, "-c", PIKA_SCRIPT, work_queue], needs_broker=True),
        Command(
            "publish",
            [rmqdelay, "publish", DESTINATION, "startup bench", "--delay", "10s"],
            needs_broker=True,
        ),
    ]


def _shown(command: Command) -> str:
    if command.name == "floor":
        return "python -c '<import click, pika; connect; publish; close>'"
    if command.name == "pika_script":
        return "python -c '<import pika; connect; one confirmed publish; close>'"
    return " ".join(
        Path(a).name if i == 0 else (repr(a) if " " in a else a) for i, a in enumerate(command.argv)
    )


def _run(argv: list[str], env: dict[str, str]) -> float:
    """Run *argv* to its end; its wall time in ms. A failure stops the benchmark."""
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    elapsed = (time.perf_counter() - started) * 1000
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-800:]}")
    return elapsed


def measure(todo: list[Command], env: dict[str, str], repeats: int) -> dict[str, list[float]]:
    """Every command once untimed, then *repeats* timed rounds, the commands in turn."""
    for command in todo:
        _run(command.argv, env)
    times: dict[str, list[float]] = {command.name: [] for command in todo}
    for _ in range(repeats):
        for command in todo:
            times[command.name].append(round(_run(command.argv, env), 1))
    return times


def summarize(times: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    medians = {name: statistics.median(runs) for name, runs in times.items()}
    reference = medians["reference"]
    summary: dict[str, dict[str, Any]] = {}
    for name, runs in times.items():
        row: dict[str, Any] = {
            "median_ms": round(medians[name], 1),
            "min_ms": min(runs),
            "max_ms": max(runs),
            "runs_ms": runs,
            "ratio_to_reference": round(medians[name] / reference, 2),
            "before_ms": BEFORE_MS.get(name),
        }
        target = TARGETS_MS.get(name)
        if target is not None:
            ratio = target / REFERENCE_MS
            row |= {
                "target_ms": target,
                "meets_target_ms": medians[name] <= target,
                "target_ratio": round(ratio, 2),
                "meets_target_ratio": medians[name] <= ratio * reference,
            }
        script = medians.get("pika_script")
        if script:
            row["ratio_to_pika_script"] = round(medians[name] / script, 2)
            if name in SCRIPT_TARGETS:
                row["target_script_ratio"] = SCRIPT_TARGETS[name]
                row["meets_target_script_ratio"] = medians[name] <= SCRIPT_TARGETS[name] * script
        summary[name] = row
    return summary


def show(summary: dict[str, dict[str, Any]], shown: dict[str, str], repeats: int) -> None:
    print(f"\nstart-up, median of {repeats} fresh processes (ms):")
    width = max(len(text) for text in shown.values())
    print(f"  {'command':<{width}} {'median':>7} {'x ref':>6} {'x script':>8}  target")
    for name, row in summary.items():
        verdict = ""
        if "target_ms" in row:
            ms = "ok" if row["meets_target_ms"] else "over"
            ratio = "ok" if row["meets_target_ratio"] else "over"
            verdict = (
                f"<= {row['target_ms']:.0f} ms: {ms}; <= {row['target_ratio']:.2f} x ref: {ratio}"
            )
        if "target_script_ratio" in row:
            met = "ok" if row["meets_target_script_ratio"] else "over"
            verdict += f"; <= {row['target_script_ratio']:.1f} x script: {met}"
        script = row.get("ratio_to_pika_script")
        print(
            f"  {shown[name]:<{width}} {row['median_ms']:>7.0f} "
            f"{row['ratio_to_reference']:>6.2f} {'' if script is None else f'{script:.2f}':>8}"
            f"  {verdict}"
        )


def write(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    print(f"wrote {path}")


def _topology(rmqdelay: str, verb: list[str], env: dict[str, str]) -> None:
    argv = [rmqdelay, "topology", *verb, "--destination", DESTINATION]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench startup", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--url", default=DEFAULT_AMQP_URL, help="broker for the publish")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each command")
    parser.add_argument("--no-publish", action="store_true", help="skip the broker command")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args(argv)

    python = sys.executable
    rmqdelay = str(Path(sys.executable).with_name("rmqdelay"))  # the venv's console script
    if not Path(rmqdelay).exists():
        raise SystemExit(f"no {rmqdelay}: install the package in this venv (make venv)")
    prefix = f"bench-startup-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "RMQDELAY_URL": args.url, "RMQDELAY_PREFIX": prefix}
    # An installed package runs from bytecode caches: the untimed round writes them, which
    # PYTHONDONTWRITEBYTECODE (set in some shells and CI images) would forbid, so that every
    # timed run compiled rmqdelay's sources again (about 65 ms, measured).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    from rmqdelay import Settings

    work_queue = Settings(url=args.url, prefix=prefix).layout.work_queue(DESTINATION)
    todo = [
        c
        for c in commands(python, rmqdelay, work_queue)
        if not (c.needs_broker and args.no_publish)
    ]
    shown = {c.name: _shown(c) for c in todo}

    load_before = machine_load(2.0)
    print(f"machine busy {load_before['busy_percent']}% before (load {load_before['loadavg']})")
    started = time.perf_counter()
    if not args.no_publish:
        _topology(rmqdelay, ["apply"], env)
    try:
        times = measure(todo, env, args.repeats)
    finally:
        if not args.no_publish:
            _topology(rmqdelay, ["destroy", "--yes", "--force"], env)
    load_after = {"loadavg": [round(v, 2) for v in os.getloadavg()]}
    summary = summarize(times)
    show(summary, shown, args.repeats)
    print(f"load average before {load_before['loadavg']}, after {load_after['loadavg']}")
    write(
        args.out,
        {
            "workload": "startup",
            "generated_at_ms": now_ms(),
            "command": masked([Path(sys.executable).name, "-m", "bench", "startup", *(argv or [])]),
            "machine": machine_info(),
            "load_before": load_before,
            "load_after": load_after,
            "params": {
                "repeats": args.repeats,
                "warmup_rounds": 1,
                "commands": {c.name: shown[c.name] for c in todo},
                "reference_ms_of_targets": REFERENCE_MS,
                "targets_ms": TARGETS_MS,
                "before_ms": BEFORE_MS,
                "script_targets": SCRIPT_TARGETS,
            },
            "results": summary,
            "total_seconds": round(time.perf_counter() - started, 1),
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
