"""Count the queues a command declares, in every Python process it starts.

    python scripts/count_queues.py [--log FILE] -- pytest -q tests

Runs the command with a ``sitecustomize`` first on ``PYTHONPATH`` that wraps pika's and
aiormq's ``queue_declare`` (the calls every rmqdelay queue goes through, in pytest, the
CLI subprocesses and the README examples alike) and appends one line per non-passive
declare: the queue's name and its ``x-queue-type``.  Then it prints how many distinct
queues of each type were declared, and exits with the command's code.

Counted at the client, so other people's use of the same broker does not count; a
subprocess started with its own ``PYTHONPATH`` is not counted (the tests' worker
subprocesses, which declare no queue).  A name declared twice counts once.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

SITECUSTOMIZE = """
import inspect, json, os

def _rmqdelay_count_queues():
    log = os.environ.get("RMQDELAY_QUEUE_LOG")
    if not log:
        return

    def wrap(cls, is_async):
        original = cls.queue_declare
        signature = inspect.signature(original)

        def record(args, kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            if bound.arguments.get("passive"):
                return
            arguments = bound.arguments.get("arguments") or {}
            row = {"name": bound.arguments.get("queue"),
                   "type": str(arguments.get("x-queue-type", "classic"))}
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(row) + "\\n").encode())
            finally:
                os.close(fd)

        if is_async:
            async def queue_declare(*args, **kwargs):
                record(args, kwargs)
                return await original(*args, **kwargs)
        else:
            def queue_declare(*args, **kwargs):
                record(args, kwargs)
                return original(*args, **kwargs)
        cls.queue_declare = queue_declare

    try:
        import pika.channel
        wrap(pika.channel.Channel, False)
    except ImportError:
        pass
    try:
        import aiormq.channel
        wrap(aiormq.channel.Channel, True)
    except ImportError:
        pass

_rmqdelay_count_queues()
"""


def summarize(log: Path) -> dict[str, int]:
    """Distinct queue names declared, by queue type."""
    seen: dict[str, str] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            row = json.loads(line)
            seen[str(row["name"])] = str(row["type"])
    return dict(Counter(seen.values()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--log", type=Path, help="keep the declare log here")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    with tempfile.TemporaryDirectory(prefix="count-queues-") as tmp:
        Path(tmp, "sitecustomize.py").write_text(SITECUSTOMIZE)
        log = args.log or Path(tmp, "declares.jsonl")
        log.unlink(missing_ok=True)
        path = os.environ.get("PYTHONPATH")
        env = {
            **os.environ,
            "PYTHONPATH": tmp if not path else f"{tmp}{os.pathsep}{path}",
            "RMQDELAY_QUEUE_LOG": str(log.resolve()),
        }
        code = subprocess.call(command, env=env)
        counts = summarize(log)
    total = sum(counts.values())
    by_type = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))
    print(f"count_queues: {total} distinct queues declared ({by_type or 'none'})", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
