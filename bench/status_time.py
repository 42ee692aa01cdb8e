"""How long ``rmqdelay status`` takes with N messages pending, by both sources.

    python -m bench.status_time --pending 1000000

Publishes N small messages with delays spread over 1 to 6 hours into a fresh prefix,
times ``rmqdelay status --json`` (the CLI, start-up included; median of 5) through the
management API and through passive declares, then destroys the prefix.
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
from pathlib import Path

from bench.common import DEFAULT_AMQP_URL
from rmqdelay import Publisher, Settings, TopologyManager

RESULTS = Path(__file__).resolve().parent / "results" / "status.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    settings = Settings(url=args.url, prefix=f"bench-status-{uuid.uuid4().hex[:6]}", max_delay="7h")
    with TopologyManager(settings) as manager:
        manager.apply(["pending"])
    try:
        started = time.perf_counter()
        with Publisher(settings) as publisher:
            for base in range(0, args.pending, 20_000):
                n = min(20_000, args.pending - base)
                publisher.publish_many(
                    {"destination": "pending", "body": b"x", "delay": 3600 + (base + i) % 18000}
                    for i in range(n)
                )
        print(f"published {args.pending:,} in {time.perf_counter() - started:.0f} s")
        env = {
            **os.environ,
            "RMQDELAY_URL": settings.url.get_secret_value(),
            "RMQDELAY_PREFIX": settings.prefix,
        }
        env["RMQDELAY_MAX_DELAY"] = "7h"
        rmqdelay = str(Path(sys.executable).with_name("rmqdelay"))

        def status(*extra: str) -> int:
            proc = subprocess.run(
                [rmqdelay, "status", "--json", *extra], env=env, capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise SystemExit(f"rmqdelay status failed: {proc.stderr.strip()[-500:]}")
            return int(json.loads(proc.stdout)["scheduled"])

        # the API's counts lag by its statistics interval: time it once it sees them all
        deadline = time.monotonic() + 60
        while status() < args.pending:
            if time.monotonic() > deadline:
                print("the management API still counts fewer than were published")
                break
            time.sleep(1)
        result: dict[str, object] = {"pending": args.pending, "load_1min": os.getloadavg()[0]}
        for label, extra in (("management", []), ("amqp", ["--amqp-only"])):
            times, scheduled = [], 0
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                scheduled = status(*extra)
                times.append(time.perf_counter() - t0)
            result[f"{label}_s"] = statistics.median(times)
            result[f"{label}_scheduled"] = scheduled
            print(
                f"status via {label}: {statistics.median(times):.2f} s (median of "
                f"{args.repeats}, CLI start-up included), counted {scheduled:,} scheduled"
            )
        starts = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            subprocess.run([rmqdelay, "status", "--help"], env=env, capture_output=True, check=True)
            starts.append(time.perf_counter() - t0)
        result["cli_start_s"] = statistics.median(starts)
        result["load_1min_after"] = os.getloadavg()[0]
        print(f"CLI start-up alone (status --help): {statistics.median(starts):.2f} s")
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        with TopologyManager(settings) as manager:
            manager.destroy(force=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
