"""The self-check that guards rmqdelay's reaches into pika's internals, and its switch.

A pika outside the checked versions, or one lacking an attribute the fast path uses,
turns the fast path off with one warning; ``RMQDELAY_CLIENT_FAST=0`` turns it off
silently. The broker tests run the sync publisher on both paths (the ``pika_path``
fixture of tests/conftest.py).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pika
import pika.channel
import pika.connection
import pytest

from rmqdelay.amqp import pika_private

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_pika_passes_the_check() -> None:
    assert pika_private.self_check() is None
    assert pika_private.FAST


@pytest.mark.parametrize("version", ["1.2.1", "1.5.0", "2.0.0", "0.13.1"])
def test_a_pika_outside_the_bounds_is_refused(version: str) -> None:
    problem = pika_private.self_check(version)
    assert problem is not None and f"pika {version} is outside" in problem


@pytest.mark.parametrize(
    ("cls", "name"),
    [
        (pika.connection.Connection, "_output_marshaled_frames"),
        (pika.channel.Channel, "_set_cookie"),
        (pika.channel.Channel, "_raise_if_not_open"),
    ],
)
def test_a_missing_attribute_is_refused(
    monkeypatch: pytest.MonkeyPatch, cls: type, name: str
) -> None:
    monkeypatch.delattr(cls, name)
    problem = pika_private.self_check()
    assert problem is not None and name in problem and cls.__name__ in problem


def test_a_refusal_warns_once_and_selects_the_public_path(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(pika_private.SWITCH, raising=False)
    monkeypatch.setattr(pika, "__version__", "1.9.0")
    with caplog.at_level(logging.WARNING, logger="rmqdelay.pika"):
        assert pika_private._decide() is False
    (record,) = caplog.records
    assert "pika 1.9.0 is outside" in record.getMessage()
    assert "public API" in record.getMessage()


def test_a_connection_without_the_expected_internals_turns_the_fast_path_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Instance attributes are checked on the first connection (not built here: any
    object without ``_impl`` stands for a pika that renamed it)."""
    monkeypatch.setattr(pika_private, "FAST", True)
    monkeypatch.setattr(pika_private, "_instances_checked", False)
    stand_in = object.__new__(pika.BlockingConnection)
    with caplog.at_level(logging.WARNING, logger="rmqdelay.pika"):
        assert pika_private.usable(stand_in) is False
        assert pika_private.usable(stand_in) is False
    assert pika_private.FAST is False
    assert len(caplog.records) == 1 and "no _impl" in caplog.records[0].getMessage()
    assert pika_private.server_properties(stand_in) == {}


@pytest.mark.parametrize(("value", "fast"), [("0", False), ("off", False), ("1", True), ("", True)])
def test_the_switch_forces_the_public_path_without_a_warning(value: str, fast: bool) -> None:
    code = """
        import logging, sys
        logging.basicConfig(stream=sys.stdout, level=logging.WARNING)
        from rmqdelay.amqp import pika_private
        print(pika_private.FAST)
    """
    env = {"RMQDELAY_CLIENT_FAST": value, "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == [str(fast)]  # no warning line


def test_the_bounds_are_pyprojects() -> None:
    (line,) = re.findall(r'^\s*"(pika[^"]*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    low, below = pika_private.PIKA_BOUNDS
    assert line.replace(" ", "") == f"pika>={low[0]}.{low[1]},<{below[0]}.{below[1]}"
