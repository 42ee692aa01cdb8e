"""Where rmqdelay's lateness comes from: rounding, and what each hop adds.

    python -m bench.lateness_breakdown --rate 500 --runs 3
    python -m bench.lateness_breakdown --rate 1000 --worker aiopika   # a bare consumer instead

Runs the steady workload (delays 1 to 4 s) on one rmqdelay peer and, per message, replans
the requested delay with ``plan_delay``: the rounding excess is ``units x resolution -
delay``; what is left of the lateness beyond it is split by the number of hops.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict

from bench.common import DEFAULT_AMQP_URL, percentile
from bench.peers.rmqdelay_peer import DESTINATION, RmqdelayPeer
from bench.scenarios_peers import Sizes, steady_run
from rmqdelay import plan_delay


async def run(args: argparse.Namespace) -> None:
    peer = RmqdelayPeer(args.url, worker=args.worker)
    await peer.setup()
    try:
        layout = peer.settings_layout()
        for k in range(args.runs):
            sizes = Sizes(
                rate=args.rate,
                duration_s=args.duration_s,
                min_delay_ms=args.min_delay_ms,
                max_delay_ms=args.max_delay_ms,
                drain_slack_s=15,
                seed=k,
            )
            summary, records = await steady_run(peer, sizes, seed=k, tag=f"lb{k}")
            by_hops: dict[int, list[float]] = defaultdict(list)
            excess_all: list[float] = []
            for r in records:
                delay = r.due_at_ms - r.published_at_ms
                plan = plan_delay(layout, delay * 1000, DESTINATION)
                excess = plan.units * layout.resolution_ms - delay
                excess_all.append(excess)
                by_hops[len(plan.hops)].append(r.lateness_ms - excess)
            st = summary["stats"]
            print(
                f"run {k}: lateness p50 {st['p50_ms']:.0f} p99 {st['p99_ms']:.0f} max "
                f"{st['max_ms']:.0f} ms; rounding adds {sum(excess_all) / len(excess_all):.1f} "
                "ms on average; beyond rounding:"
            )
            for hops in sorted(by_hops):
                values = sorted(by_hops[hops])
                print(
                    f"  {hops} hop(s): n={len(values):5}  p50 {percentile(values, 50):4.0f}  "
                    f"p90 {percentile(values, 90):4.0f}  p99 {percentile(values, 99):4.0f} ms"
                )
    finally:
        await peer.teardown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lateness_breakdown", description=__doc__)
    p.add_argument("--rate", type=float, default=500.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--duration-s", type=float, default=4.0)
    p.add_argument("--min-delay-ms", type=int, default=1000)
    p.add_argument("--max-delay-ms", type=int, default=4000)
    p.add_argument("--worker", choices=("subprocess", "inproc", "aiopika"), default="subprocess")
    p.add_argument("--url", default=DEFAULT_AMQP_URL)
    asyncio.run(run(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
