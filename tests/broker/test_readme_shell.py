"""The shell examples of the README and the docs that use the ``rmqdelay`` command run
as written.

A ``sh`` block runs when every command in it is ``rmqdelay ...`` or an ``export`` of an
``RMQDELAY_*`` variable; the test broker's URL and a fresh prefix replace the example's
own. Blocks that install, call ``make`` or start a long-running worker are left out, and
synopses are ``text`` blocks, not ``sh``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import rmqdelay_env
from tests.helpers.readme_blocks import RUNNABLE_SH, Block, commands

# tests/unit/test_readme_blocks.py checks that the quickstart's block is among these


@pytest.mark.parametrize("block", RUNNABLE_SH, ids=[b.id for b in RUNNABLE_SH])
def test_readme_shell_block_runs(block: Block, amqp_url: str, prefix: str) -> None:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    # a one-day maximum keeps the test's topology small on a shared broker
    env = rmqdelay_env(amqp_url, prefix, max_delay="1d", extra={"PATH": path})
    # the example's own broker URL gives way to the test broker's
    script = "\n".join(c for c in commands(block.code) if not c.startswith("export RMQDELAY_URL="))
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (block.id, result.stdout[-1500:], result.stderr[-1500:])
