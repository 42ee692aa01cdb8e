"""The start-up heap freeze: once per process, after a collection (in a fresh
interpreter each, so the test process's own heap is left alone)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc
from rmqdelay.worker.heap import freeze_startup_heap

assert gc.get_freeze_count() == 0
first = freeze_startup_heap()
assert first == gc.get_freeze_count() > 1000, first  # the imports' objects, at least
made = [[i] for i in range(5000)]
again = freeze_startup_heap()  # once per process: what was made since stays collectable
assert again == first, (first, again)
print("ok", first)
"""


def test_the_start_up_heap_is_frozen_once_per_process() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.startswith("ok "), done.stdout + done.stderr
