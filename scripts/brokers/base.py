"""What every broker source shares: the result type, URL masking, progress lines and
running a command whose daemon outlives it.

Passwords are never printed: diagnostics always go through :func:`mask_url` or
:func:`scrub`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "LOOPBACK_HOSTS",
    "BrokerInfo",
    "BrokerUnavailable",
    "SecretUrl",
    "credentials",
    "error",
    "host_port",
    "is_loopback",
    "log",
    "mask_url",
    "notice",
    "run_captured",
    "scrub",
    "set_quiet",
]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class BrokerUnavailable(RuntimeError):
    """No broker could be found or started; the message says what to do."""


def mask_url(url: str) -> str:
    """Return *url* with its password (if any) replaced by ``***``."""
    try:
        parts = urllib.parse.urlsplit(url)
        userinfo, sep, hostport = parts.netloc.rpartition("@")
    except ValueError:
        return re.sub(r"(://[^:/@\s]*):[^@\s]*@", r"\1:***@", url)
    if not sep or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{hostport}"))


class SecretUrl(str):
    """A URL string whose repr() masks the password (pytest prints fixture values' repr
    in failure tracebacks); str(), f-strings and comparisons give the real URL."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(mask_url(str(self)))


@dataclass(frozen=True)
class BrokerInfo:
    """A broker that answers AMQP, and where it came from."""

    url: str  # amqp://user:password@host:port/vhost -- contains the password: never print
    management_url: str | None  # http://host:15672, no credentials embedded
    source: str  # "env" | "local" | "testcontainers" | "debian"

    @property
    def masked_url(self) -> str:
        return mask_url(self.url)

    def __repr__(self) -> str:  # keep the password out of tracebacks and pytest output
        return (
            f"BrokerInfo(url={self.masked_url!r}, management_url={self.management_url!r}, "
            f"source={self.source!r})"
        )

    __str__ = __repr__


# --------------------------------------------------------------------------- output

_quiet = False


def set_quiet(quiet: bool) -> None:
    """Silence :func:`log` (the CLI's ``--quiet``); errors and notices still print."""
    global _quiet
    _quiet = quiet


def log(message: str) -> None:
    """Progress on stderr (silenced by --quiet)."""
    if not _quiet:
        print(f"[broker] {message}", file=sys.stderr, flush=True)


def notice(message: str) -> None:
    """Something the user must see even with --quiet: a change to a broker not ours."""
    print(f"[broker] NOTE: {message}", file=sys.stderr, flush=True)


def error(message: str) -> None:
    print(f"[broker] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- URLs


def scrub(text: str, url: str) -> str:
    """Remove the password of *url* from an error message, whatever its encoding."""
    text = text.replace(url, mask_url(url))
    try:
        raw = urllib.parse.urlsplit(url).password
    except ValueError:
        raw = None
    if raw:
        for secret in {raw, urllib.parse.unquote(raw)}:
            if len(secret) >= 3:  # don't mangle messages over a one-letter password
                text = text.replace(secret, "***")
    return text


def host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    default = 5671 if parts.scheme == "amqps" else 5672
    return parts.hostname or "localhost", parts.port or default


def credentials(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    user = urllib.parse.unquote(parts.username) if parts.username is not None else "guest"
    pw = urllib.parse.unquote(parts.password) if parts.password is not None else "guest"
    return user, pw


def is_loopback(url: str) -> bool:
    try:
        return host_port(url)[0] in LOOPBACK_HOSTS
    except ValueError:
        return False


# --------------------------------------------------------------------------- processes


def run_captured(
    cmd: Sequence[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
    *,
    new_session: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run *cmd* with its output in a temporary file, not a pipe: a daemon it starts
    (``rabbitmq-server -detached``, epmd) may keep inherited pipes open for ever.
    ``new_session``: in a session of its own (setsid), out of reach of the terminal's
    signals (a Ctrl-C while a node starts)."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.run(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
            env=None if env is None else {**os.environ, **env},
            start_new_session=new_session,
        )
        out.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), "")
