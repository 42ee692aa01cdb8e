"""The README's Python examples run as written, against the test broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import rmqdelay_env
from tests.helpers.readme_blocks import PYTHON_BLOCKS

# tests/unit/test_readme_blocks.py checks that there are blocks to run


@pytest.mark.parametrize(
    "code", PYTHON_BLOCKS, ids=[f"block{i}" for i in range(len(PYTHON_BLOCKS))]
)
def test_readme_python_block_runs(code: str, amqp_url: str, prefix: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code)
    # a one-day maximum keeps the test's topology small on a shared broker
    env = rmqdelay_env(amqp_url, prefix, max_delay="1d")
    result = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
