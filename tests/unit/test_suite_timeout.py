"""A broker that accepts a connection and never answers must fail the test waiting on it,
by name, and let the run go on (pytest-timeout, configured in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

WEDGED = """
import socket


def test_waits_on_a_wedged_broker():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    client.recv(1)  # the "broker" accepted and never answers


def test_after_it():
    assert True
"""


def test_the_suite_has_a_per_test_timeout_that_names_the_stuck_test(tmp_path: Path) -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 60 <= int(options["timeout"]) <= 600, options["timeout"]
    assert options["timeout_method"] == "signal"  # the run goes on after the stuck test

    (tmp_path / "test_wedged.py").write_text(WEDGED)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "timeout=2",
            "-o",
            "timeout_method=signal",
            "-rf",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED test_wedged.py::test_waits_on_a_wedged_broker" in done.stdout, done.stdout
    assert "Timeout" in done.stdout, done.stdout
    assert "1 failed, 1 passed" in done.stdout, done.stdout
