"""The Python examples of the README and the docs run as written, against the test broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import rmqdelay_env
from tests.helpers.readme_blocks import PYTHON_BLOCKS, Block

# tests/unit/test_readme_blocks.py checks that there are blocks to run


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.id for b in PYTHON_BLOCKS])
def test_readme_python_block_runs(block: Block, amqp_url: str, prefix: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.code)
    # a one-day maximum keeps the test's topology small on a shared broker
    env = rmqdelay_env(amqp_url, prefix, max_delay="1d")
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, (block.id, result.stderr[-2000:])
