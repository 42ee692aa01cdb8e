"""What keys cost a publisher: the publish rate with keys against without, in one run.

    python -m bench.keyed                     # the figures the README shows
    python -m bench.keyed --many 5000 --single 500 --repeats 7

Both modes publish to the same destination of one layout, journal on, alternating
rounds (keys off, keys on, off, on, ...), each on a publisher of its own opened once:

- ``many``: ``Publisher.publish_many`` of N messages, each with a key of its own
  (``on_conflict="ignore"``): one read of the journal back per batch.
- ``single``: N ``Publisher.publish`` calls one after another, each keyed: one read back
  per message, on the follower the publisher keeps open.

A keyed publish reads the journal back to its own record before it answers; the ratio
is keyed / unkeyed messages per second (the medians). Results go to
``bench/results/keyed.json``; the prefix is destroyed after.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import DEFAULT_AMQP_URL
from rmqdelay import Publisher, Settings, TopologyManager

RESULTS = Path(__file__).resolve().parent / "results" / "keyed.json"
BODY = b"x" * 100
DEST = "keyed"


def _many(publisher: Publisher, count: int, keyed: bool) -> float:
    run = uuid.uuid4().hex[:8]
    extra: Callable[[int], dict[str, Any]] = (
        (lambda i: {"key": f"{run}-{i}", "on_conflict": "ignore"}) if keyed else (lambda i: {})
    )
    requests = [
        {"destination": DEST, "body": BODY, "delay": 600 + i % 60, **extra(i)} for i in range(count)
    ]
    started = time.perf_counter()
    results = publisher.publish_many(requests)
    elapsed = time.perf_counter() - started
    if keyed:
        assert all(r.outcome == "scheduled" for r in results)
    return count / elapsed


def _single(publisher: Publisher, count: int, keyed: bool) -> float:
    run = uuid.uuid4().hex[:8]
    started = time.perf_counter()
    for i in range(count):
        if keyed:
            publisher.publish(
                DEST, BODY, delay=600 + i % 60, key=f"{run}-{i}", on_conflict="ignore"
            )
        else:
            publisher.publish(DEST, BODY, delay=600 + i % 60)
    return count / (time.perf_counter() - started)


def _alternate(
    measure: Callable[[Publisher, int, bool], float],
    off: Publisher,
    on: Publisher,
    count: int,
    repeats: int,
) -> dict[str, Any]:
    measure(off, max(1, count // 4), False)  # warm both paths (the keyed one's first
    measure(on, max(1, count // 4), True)  # read back folds the journal from its start)
    runs: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(repeats):
        runs["off"].append(measure(off, count, False))
        runs["on"].append(measure(on, count, True))
    result: dict[str, Any] = {
        "count": count,
        "repeats": repeats,
        "off_msgs_per_s": statistics.median(runs["off"]),
        "on_msgs_per_s": statistics.median(runs["on"]),
        "runs": runs,
    }
    result["ratio"] = result["on_msgs_per_s"] / result["off_msgs_per_s"]
    # each keyed round against the unkeyed one just before it: a busy machine's drift
    # between rounds cancels out
    pairs = [on / off for off, on in zip(runs["off"], runs["on"], strict=True)]
    result["pair_ratio_median"] = statistics.median(pairs)
    return result


def measure(url: str, many: int, single: int, repeats: int) -> dict[str, Any]:
    settings = Settings(
        url=url,
        prefix=f"bench-keyed-{uuid.uuid4().hex[:6]}",
        max_delay="2h",
        connection_name="bench-keyed",
    )
    with TopologyManager(settings) as manager:
        manager.apply([DEST])
    out: dict[str, Any] = {}
    try:
        with Publisher(settings) as off, Publisher(settings) as on:
            if many:
                out["many"] = _alternate(_many, off, on, many, repeats)
                _say("publish_many", out["many"])
            if single:
                out["single"] = _alternate(_single, off, on, single, repeats)
                _say("publish", out["single"])
    finally:
        with TopologyManager(settings) as manager:
            manager.destroy([DEST], force=True)
    return out


def _say(what: str, result: dict[str, Any]) -> None:
    print(
        f"{what}: keys off {result['off_msgs_per_s']:,.0f} msgs/s, on "
        f"{result['on_msgs_per_s']:,.0f} msgs/s, ratio {result['ratio']:.2f} "
        f"(median of pairs {result['pair_ratio_median']:.2f}; {result['count']} a round, "
        f"median of {result['repeats']})",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.keyed", description=__doc__)
    parser.add_argument("--url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--many", type=int, default=5000, help="messages a publish_many round")
    parser.add_argument("--single", type=int, default=500, help="publish calls a round")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    result = measure(args.url, args.many, args.single, args.repeats)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"url_port": args.url.rsplit(":", 1)[-1], **result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
