"""Run the ``rmqdelay`` command line in this process, counting what its sockets read.

    python -m bench.history_probe scheduled list --limit 50

``bench.history`` runs every timed command through this: the bytes the process read from
the broker (every socket's ``recv`` and ``recv_into``: pika's and asyncio's) and its
peak RSS (``VmHWM``: the kernel's own, not carried over from the parent as
``ru_maxrss`` is) are written as JSON to ``$BENCH_PROBE`` when the process ends, or
when :func:`report` is called (a worker's first handled message).
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import socket
import sys
import time
from typing import Any

READ = [0]
_recv = socket.socket.recv
_recv_into = socket.socket.recv_into


def _counted_recv(self: socket.socket, *args: Any, **kwargs: Any) -> bytes:
    data = _recv(self, *args, **kwargs)
    READ[0] += len(data)
    return data


def _counted_recv_into(self: socket.socket, *args: Any, **kwargs: Any) -> int:
    count = _recv_into(self, *args, **kwargs)
    READ[0] += count
    return count


def peak_rss_kb() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def report(**extra: Any) -> None:
    """Write what was read and the peak RSS so far (once: the first call wins)."""
    path = os.environ.get("BENCH_PROBE")
    if not path or os.path.exists(path):
        return
    said = {"read_bytes": READ[0], "peak_rss_kb": peak_rss_kb(), "at": time.time(), **extra}
    with open(path, "w", encoding="utf-8") as out:
        json.dump(said, out)


def main() -> None:
    sys.modules.setdefault("bench.history_probe", sys.modules[__name__])  # one READ
    socket.socket.recv = _counted_recv  # type: ignore[method-assign,assignment]
    socket.socket.recv_into = _counted_recv_into  # type: ignore[method-assign,assignment]
    atexit.register(report)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # atexit runs then
    sys.argv = ["rmqdelay", *sys.argv[1:]]
    runpy.run_module("rmqdelay.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
