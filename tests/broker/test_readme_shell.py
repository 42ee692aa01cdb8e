"""The README's shell examples that use the ``rmqdelay`` command run as written.

A ``sh`` block runs when every command in it is ``rmqdelay ...`` or an ``export`` of an
``RMQDELAY_*`` variable; the test broker's URL and a fresh prefix replace the example's
own. Blocks that install, call ``make`` or start a long-running worker are left out, and
synopses are ``text`` blocks, not ``sh``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
SH_BLOCKS = re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S)


def _commands(block: str) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in block.splitlines())
    return [line for line in lines if line]


def _runnable(block: str) -> bool:
    commands = _commands(block)
    return bool(commands) and all(
        (c.startswith("rmqdelay ") and not c.startswith("rmqdelay worker "))
        or c.startswith("export RMQDELAY_")
        for c in commands
    )


RUNNABLE = [b for b in SH_BLOCKS if _runnable(b)]


def test_the_quickstart_commands_are_among_the_runnable_blocks() -> None:
    assert any("rmqdelay publish" in b and "rmqdelay consume" in b for b in RUNNABLE), (
        "the quickstart's publish/consume block is no longer picked up by this test"
    )


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"sh{i}" for i in range(len(RUNNABLE))])
def test_readme_shell_block_runs(block: str, amqp_url: str, prefix: str) -> None:
    env = {
        **os.environ,
        "RMQDELAY_URL": amqp_url,
        "RMQDELAY_PREFIX": prefix,
        "RMQDELAY_MAX_DELAY": "1d",  # a small topology on the shared broker
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    # the example's own broker URL gives way to the test broker's
    script = "\n".join(c for c in _commands(block) if not c.startswith("export RMQDELAY_URL="))
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (result.stdout[-1500:], result.stderr[-1500:])
