"""Does something answer?  TCP, AMQP and management API probes that start nothing.

Only the standard library is required; pika is used when importable (a real
connection, with the broker's version), else a bare AMQP protocol handshake.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import credentials, host_port, scrub

__all__ = ["amqp_ok", "listener_pid", "management_ok", "open_files_limit", "tcp_open", "wait_for"]


def tcp_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def listener_pid(port: int, proc: Path = Path("/proc")) -> int | None:
    """The process listening on TCP ``port`` of this machine, or None when unknown (not
    listening, or its file descriptors unreadable: another user's process, not root)."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in (proc / "net" / table).read_text().splitlines()[1:]:
                fields = line.split()
                # local_address is HEXIP:HEXPORT; state 0A is LISTEN
                if len(fields) > 9 and fields[3] == "0A" and fields[1].endswith(f":{port:04X}"):
                    inodes.add(fields[9])
    wanted = {f"socket:[{inode}]" for inode in inodes}
    if not wanted:
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in wanted:
                        return int(entry.name)
    return None


def open_files_limit(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The soft open-files limit of process ``pid``, or None when unknown (unlimited
    counts as unknown: nothing to raise)."""
    with contextlib.suppress(OSError):
        for line in (proc / str(pid) / "limits").read_text().splitlines():
            if line.startswith("Max open files"):
                soft = line[len("Max open files") :].split()[0]
                return int(soft) if soft.isdigit() else None
    return None


def _handshake(host: str, port: int, timeout: float) -> tuple[bool, str]:
    """Stdlib-only probe: send the AMQP 0-9-1 header, expect connection.start back."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            data = b""
            while len(data) < 11:
                chunk = sock.recv(64)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        return False, f"{type(exc).__name__}: {exc}"
    # frame type 1 (method), channel 0, ..., class 10 (connection), method 10 (start)
    if len(data) >= 11 and data[0] == 1 and data[7:11] == b"\x00\x0a\x00\x0a":
        return True, "ok (protocol handshake only: pika is not installed)"
    return False, f"not an AMQP 0-9-1 server (answered {data[:8]!r})"


def amqp_ok(url: str, timeout: float = 5.0) -> tuple[bool, str]:
    """Open (and close) an AMQP connection to *url*.  Returns (ok, scrubbed detail)."""
    try:
        import pika  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        try:
            host, port = host_port(url)
        except ValueError as exc:
            return False, f"bad URL: {exc}"
        return _handshake(host, port, timeout)
    try:
        params = pika.URLParameters(url)
        params.socket_timeout = timeout
        params.stack_timeout = timeout * 2
        params.blocked_connection_timeout = timeout
        params.connection_attempts = 1
        params.retry_delay = 0
        params.client_properties = {"connection_name": "rmqdelay-broker-probe"}
        conn = pika.BlockingConnection(params)
    except Exception as exc:
        detail = repr(exc) if exc.args else type(exc).__name__  # pika's str() is often empty
        return False, scrub(detail, url)
    try:
        version = getattr(conn, "_impl").server_properties.get("version", b"?")  # noqa: B009
        if isinstance(version, bytes):
            version = version.decode(errors="replace")
    except Exception:
        version = "?"
    blocked = _blocks_publishers(conn, pika)
    with contextlib.suppress(Exception):
        conn.close()
    if blocked:
        return False, f"RabbitMQ {version} answers but blocks publishers: {blocked}"
    return True, f"ok (RabbitMQ {version})"


def _blocks_publishers(conn: Any, pika: Any) -> str:
    """Why a confirmed publish does not go through, or "" when it does: a node under a
    memory or disk alarm (one left full by a benchmark, say) accepts connections and
    blocks every publisher, and a suite run on it would time out test by test. The probe
    publishes two empty messages to the default exchange, routed nowhere (dropped): the
    broker lets through the publish on which it blocks the connection."""
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        for _ in range(2):
            channel.basic_publish("", "rmqdelay.broker-probe.nowhere", b"")
    except pika.exceptions.ChannelClosedByBroker as exc:
        return "" if exc.reply_code == 403 else repr(exc)  # a user who may not publish there
    except Exception as exc:  # ConnectionBlockedTimeout: an alarm is on
        detail = repr(exc) if exc.args else type(exc).__name__
        return f"{detail} (a memory or disk alarm? rabbitmqctl status lists them)"
    return ""


def management_ok(
    management_url: str, amqp_url: str, timeout: float = 3.0, *, amqp_port: int | None = None
) -> bool:
    """True when GET <management_url>/api/overview answers with the AMQP URL's credentials.

    With *amqp_port*, the API must also list an AMQP listener on that port: on a machine
    running several brokers, an API that answers may still be another broker's.
    """
    user, pw = credentials(amqp_url)
    token = base64.b64encode(f"{user}:{pw}".encode()).decode()
    request = urllib.request.Request(
        f"{management_url.rstrip('/')}/api/overview", headers={"Authorization": f"Basic {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data: Any = json.load(response)
    except (OSError, ValueError):  # URLError/HTTPError are OSErrors; bad JSON is ValueError
        return False
    if not (isinstance(data, dict) and "rabbitmq_version" in data):
        return False
    if amqp_port is None:
        return True
    listeners = data.get("listeners") or []
    return any(
        isinstance(item, dict)
        and str(item.get("protocol", "")).startswith("amqp")
        and item.get("port") == amqp_port
        for item in listeners
    )


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.5) -> bool:
    """Poll *predicate* until it holds (True) or *timeout* seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
