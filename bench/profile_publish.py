"""Where a publisher's client time goes: rmqdelay's code, the client library, the rest.

Runs ``publish_many`` of the sync or async publisher under cProfile and adds up each
function's own time by where its code lives. cProfile slows everything it sees, so the
shares matter, not the totals; the client CPU per message without the profiler is
printed beside them.

    python -m bench.profile_publish --publisher sync --count 20000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import time
import uuid
from collections import defaultdict

from bench.publish_rate import _requests
from rmqdelay import AsyncPublisher, Publisher, Settings, TopologyManager

GROUPS = (
    ("rmqdelay.core (planning, encoding, checks)", "/rmqdelay/core/"),
    ("rmqdelay.amqp (the adapter)", "/rmqdelay/amqp/"),
    ("pika", "/pika/"),
    ("aio-pika", "/aio_pika/"),
    ("aiormq + pamqp", "/aiormq/"),
    ("aiormq + pamqp", "/pamqp/"),
    ("asyncio", "/asyncio/"),
)


def group_of(filename: str) -> str:
    if filename.startswith("~") or filename.startswith("<"):
        return "builtins (socket, struct, select ...)"
    for name, part in GROUPS:
        if part in filename:
            return name
    return "other Python"


def split(profile: cProfile.Profile) -> dict[str, float]:
    """Each function's own time (tottime), summed by group."""
    stats = pstats.Stats(profile)
    totals: dict[str, float] = defaultdict(float)
    for (filename, _line, _name), row in stats.stats.items():  # type: ignore[attr-defined]
        totals[group_of(filename)] += row[2]
    return dict(totals)


def run_once(settings: Settings, kind: str, count: int, profile: cProfile.Profile | None) -> float:
    """Client CPU seconds of one publish_many of ``count`` messages."""
    requests = _requests(count, 5)
    if kind == "sync":
        with Publisher(settings, window=500) as publisher:
            started = time.process_time()
            if profile:
                profile.enable()
            publisher.publish_many(requests)
            if profile:
                profile.disable()
            return time.process_time() - started

    async def go() -> float:
        async with AsyncPublisher(settings, window=500) as publisher:
            started = time.process_time()
            if profile:
                profile.enable()
            await publisher.publish_many(requests)
            if profile:
                profile.disable()
            return time.process_time() - started

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publisher", choices=["sync", "async"], default="sync")
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--journal", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    url = os.environ.get("RMQDELAY_URL", "amqp://guest:guest@localhost:5672/%2F")
    settings = Settings(
        url=url,
        prefix=f"bench-profile-{uuid.uuid4().hex[:6]}",
        destinations=[],
        schedule_journal=args.journal,
    )
    with TopologyManager(settings) as manager:
        manager.apply(["bench"])
        try:
            run_once(settings, args.publisher, 1000, None)  # warm-up
            plain = run_once(settings, args.publisher, args.count, None)
            profile = cProfile.Profile()
            run_once(settings, args.publisher, args.count, profile)
        finally:
            manager.destroy(["bench"], force=True)
    totals = split(profile)
    whole = sum(totals.values())
    print(
        f"{args.publisher} publish_many, {args.count:,} messages, journal "
        f"{'on' if args.journal else 'off'}: {plain / args.count * 1e6:.1f} µs of client CPU "
        "per message without the profiler; under cProfile, own time by group:"
    )
    for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {name:45} {seconds / whole:6.1%}")


if __name__ == "__main__":
    main()
