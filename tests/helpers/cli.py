"""The ``rmqdelay`` CLI as the tests run it: in a process of its own, as a user does
(:func:`run_cli`), or in this one through click's runner (:func:`invoke`), with the
environment :func:`rmqdelay_env` builds.

The environment is this process's without the caller's ``RMQDELAY_*`` (a variable
exported in the shell must not change what a test checks), except
``RMQDELAY_MANAGEMENT_URL``: it says where the test broker's management API is when that
is not ``:15672`` (``make test`` exports it then).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from rmqdelay import Settings
from rmqdelay.cli import app

__all__ = ["CLI", "invoke", "rmqdelay_env", "run_cli", "settings_env"]

CLI = (sys.executable, "-m", "rmqdelay.cli")
"""The command line that starts the CLI (the console script is the same entry point)."""

KEPT = "RMQDELAY_MANAGEMENT_URL"


def rmqdelay_env(
    url: str | None = None,
    prefix: str | None = None,
    *,
    extra: Mapping[str, str] | None = None,
    **settings: str | None,
) -> dict[str, str]:
    """The environment for the CLI: each setting as ``RMQDELAY_<NAME>`` (``None`` leaves
    it out: ``management_url=None`` drops the inherited one), ``extra`` variables as
    they are, and ``COLUMNS`` wide enough that rich does not wrap what a test reads."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQDELAY_") or k == KEPT}
    env["COLUMNS"] = "200"
    for name, value in {"url": url, "prefix": prefix, **settings}.items():
        key = f"RMQDELAY_{name.upper()}"
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    env.update(extra or {})
    return env


def settings_env(
    settings: Settings, *, extra: Mapping[str, str] | None = None, **overrides: str | None
) -> dict[str, str]:
    """:func:`rmqdelay_env` for the broker, topology and connection name of ``settings``
    (so the CLI sees the very topology the test declared), with ``overrides``."""
    values: dict[str, str | None] = {
        "url": settings.url.get_secret_value(),
        "prefix": settings.prefix,
        "max_delay": f"{settings.max_delay}ms",
        "resolution": f"{settings.resolution}ms",
        "radix": str(settings.radix),
        "queue_type": settings.queue_type,
        "connection_name": settings.connection_name,
    }
    return rmqdelay_env(extra=extra, **{**values, **overrides})


def run_cli(
    env: Mapping[str, str],
    *args: str,
    cwd: Path | None = None,
    input: str | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``rmqdelay *args`` in a process of its own; its output is captured as text."""
    return subprocess.run(
        [*CLI, *args],
        env=dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        timeout=timeout,
    )


def invoke(env: Mapping[str, str], *args: str, **options: Any) -> Result:
    """``rmqdelay *args`` in this process (click's runner), in exactly ``env``: what this
    process has and ``env`` has not is unset for the call."""
    overlay: dict[str, str | None] = {**dict.fromkeys(os.environ), **env}
    return CliRunner().invoke(app, list(args), env=overlay, prog_name="rmqdelay", **options)
