"""Broker administration for tests: connections, users, cleanup of test entities.

Uses the RabbitMQ management HTTP API when it answers (rmqdelay's own client reads it;
:meth:`BrokerAdmin._send` writes what that client does not), else ``rabbitmqctl`` on this
machine.  Queues and exchanges are deleted over AMQP with pika when the API is not there.

Never put a password in an exception message or a log line: use ``mask_url``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import aiormq
import pika
from pika.exceptions import ChannelClosed

from rmqdelay.amqp.management import ManagementApi, management_location
from rmqdelay.settings import vhost_of

__all__ = [
    "BrokerAdmin",
    "BrokerAdminError",
    "delete_prefixed",
    "make_prefix",
    "matches_prefix",
    "release_prefix",
    "server_version",
]

_GONE = frozenset({"closing", "closed"})  # connection states that count as closed


class BrokerAdminError(RuntimeError):
    pass


PREFIX_MAX = 40


def with_login(amqp_url: str, user: str, password: str, vhost: str | None = None) -> str:
    """The broker's URL with another user, password and (optionally) vhost."""
    parts = urllib.parse.urlsplit(str(amqp_url))
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port or 5672}"
    path = parts.path if vhost is None else vhost
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, path=path))


def make_prefix(test_name: str) -> str:
    """``t-<test-name-slug>-<6 hex>``: lowercase [a-z0-9-], at most 40 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")
    slug = re.sub(r"^test-", "", slug) or "x"
    suffix = secrets.token_hex(3)
    room = PREFIX_MAX - len("t--") - len(suffix)
    return f"t-{slug[:room].rstrip('-')}-{suffix}"


def matches_prefix(name: str, prefix: str) -> bool:
    """A test's entities are named ``prefix`` or ``prefix.<anything>``."""
    return name == prefix or name.startswith(prefix + ".")


def release_prefix(admin: BrokerAdmin, prefix: str) -> None:
    """What the fixtures run after a test (or a module) that named entities ``prefix``:
    :meth:`BrokerAdmin.cleanup_prefix`, warning instead of failing, so a broken broker
    does not hide the test's own result."""
    try:
        admin.cleanup_prefix(prefix)
    except Exception as exc:
        warnings.warn(f"cleanup of {prefix}.* failed: {exc!r}", stacklevel=2)


def server_version(amqp_url: str) -> str:
    """The broker's version as its AMQP handshake gives it (aiormq's public
    ``server_properties``), e.g. ``"3.10.8"``."""

    async def ask() -> str:
        connection = await aiormq.connect(amqp_url)
        try:
            version = connection.server_properties.get("version", "")
        finally:
            await connection.close()
        return version.decode() if isinstance(version, bytes) else str(version)

    return asyncio.run(ask())


def _params(amqp_url: str, connection_name: str) -> pika.URLParameters:
    params = pika.URLParameters(amqp_url)
    params.connection_attempts = 1
    params.socket_timeout = 5
    params.blocked_connection_timeout = 10
    params.client_properties = {"connection_name": connection_name}
    return params


def delete_prefixed(amqp_url: str, names: Iterable[str], *, kind: str = "both") -> int:
    """Delete the queues and/or exchanges called *names* over AMQP.

    *kind* is "queue", "exchange" or "both" (each name is deleted as both; deleting a
    missing queue or exchange is a no-op in RabbitMQ).  Returns how many deletions the
    broker accepted.  Errors on one name (e.g. an exclusive queue of a live connection)
    don't stop the others.
    """
    if kind not in ("queue", "exchange", "both"):
        raise ValueError(f"kind must be queue, exchange or both, not {kind!r}")
    names = [n for n in dict.fromkeys(names) if n and not n.startswith("amq.")]
    if not names:
        return 0
    done = 0
    conn = pika.BlockingConnection(_params(amqp_url, "rmqdelay-tests-cleanup"))
    try:
        channel = conn.channel()
        for name in names:
            ops = []
            if kind in ("queue", "both"):
                ops.append("queue_delete")
            if kind in ("exchange", "both"):
                ops.append("exchange_delete")
            for op in ops:
                try:
                    getattr(channel, op)(name)
                    done += 1
                except ChannelClosed:
                    channel = conn.channel()  # the broker closed it; carry on with a new one
    finally:
        with contextlib.suppress(Exception):
            conn.close()
    return done


class BrokerAdmin:
    """Administer the broker at *amqp_url* (management API at *management_url* if given)."""

    def __init__(
        self, amqp_url: str, management_url: str | None = None, *, timeout: float = 10.0
    ) -> None:
        self.amqp_url = amqp_url
        self.management_url = management_url.rstrip("/") if management_url else None
        self.timeout = timeout
        self.vhost = vhost_of(amqp_url)
        self._api = ManagementApi(amqp_url, management_url, timeout) if management_url else None
        self._connections_backend: str | None = None

    def __repr__(self) -> str:
        backend = "management API" if self.uses_management_api else "rabbitmqctl"
        return f"BrokerAdmin({self.management_url or '-'} via {backend})"

    # ----------------------------------------------------------------- backends

    @property
    def uses_management_api(self) -> bool:
        return self._api is not None and self._api.available

    def _get(self, path: str) -> Any:
        """GET ``/api/{path}`` through rmqdelay's client."""
        assert self._api is not None
        return self._api.get(path)

    def _send(
        self, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None
    ) -> None:
        """PUT or DELETE ``/api/{path}``: the writes rmqdelay's client does not make.  A
        DELETE of what is gone already is fine."""
        assert self.management_url is not None
        base, user, password = management_location(self.amqp_url, self.management_url)
        auth = f"{user}:{password}".encode()
        sent = {"Authorization": f"Basic {base64.b64encode(auth).decode()}", **(headers or {})}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        req = urllib.request.Request(f"{base}/api/{path}", data=data, method=method, headers=sent)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout):
                pass
        except urllib.error.HTTPError as exc:
            if method == "DELETE" and exc.code == 404:
                return
            detail = exc.read().decode(errors="replace")[:300]
            raise BrokerAdminError(f"{method} {path}: HTTP {exc.code} {detail}") from None

    @property
    def is_local_node(self) -> bool:
        """Does this machine's rabbitmqctl administer the broker behind the AMQP URL?

        True for 127.0.0.1/localhost:5672 when rabbitmqctl exists and we are root (it
        needs the node's Erlang cookie).  A container's mapped port is not that node.
        """
        parts = urllib.parse.urlsplit(self.amqp_url)
        return (
            parts.hostname in ("127.0.0.1", "localhost", "::1")
            and (parts.port or 5672) == 5672
            and shutil.which("rabbitmqctl") is not None
            and hasattr(os, "geteuid")
            and os.geteuid() == 0
        )

    def _ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        ctl = shutil.which("rabbitmqctl")
        if ctl is None or not self.is_local_node:
            raise BrokerAdminError(
                "cannot administer the broker: its management API does not answer and "
                "rabbitmqctl here does not administer it (only 127.0.0.1:5672 as root)"
            )
        proc = subprocess.run(
            [ctl, *args],
            capture_output=True,
            text=True,
            timeout=max(self.timeout, 60),
            stdin=subprocess.DEVNULL,
        )
        if check and proc.returncode != 0:
            # args may contain a password (add_user): report the command name only
            raise BrokerAdminError(
                f"rabbitmqctl {args[0]} exited {proc.returncode}: "
                f"{(proc.stderr or proc.stdout).strip()[-300:]}"
            )
        return proc

    def _ctl_json(self, *args: str) -> list[dict[str, Any]]:
        out = self._ctl(*args, "--formatter", "json", "-q").stdout.strip()
        rows = json.loads(out) if out else []
        return rows if isinstance(rows, list) else []

    @staticmethod
    def _q(segment: str) -> str:
        return urllib.parse.quote(segment, safe="")

    # ----------------------------------------------------------------- info

    def broker_version(self) -> str:
        if self.uses_management_api:
            return str(self._get("overview")["rabbitmq_version"])
        with contextlib.suppress(Exception):
            if version := server_version(self.amqp_url):
                return version
        return self._ctl("version").stdout.strip()

    def queue(self, name: str) -> dict[str, Any]:
        """What the management API says of queue *name*."""
        row: dict[str, Any] = self._get(f"queues/{self._q(self.vhost)}/{self._q(name)}")
        return row

    # ----------------------------------------------------------------- policies

    @contextlib.contextmanager
    def policy(
        self,
        name: str,
        pattern: str,
        definition: dict[str, Any],
        *,
        apply_to: str = "queues",
        priority: int = 0,
    ) -> Iterator[None]:
        """Policy *name* on this vhost for the block, deleted after it."""
        path = f"policies/{self._q(self.vhost)}/{self._q(name)}"
        body = {"pattern": pattern, "definition": definition, "apply-to": apply_to}
        self._send("PUT", path, {**body, "priority": priority})
        try:
            yield
        finally:
            self._send("DELETE", path)

    # ----------------------------------------------------------------- connections

    @property
    def connections_backend(self) -> str:
        """Backend for listing/closing connections: "rabbitmqctl" or "api".

        The management API lists a new connection only after its first stats emission
        (~5 s by default) and shows a closed one as running for as long again, while
        rabbitmqctl answers at once (~0.4 s a call).  So rabbitmqctl is preferred when it
        administers the very node behind the AMQP URL (this machine's 127.0.0.1:5672 and
        we are root); otherwise the API when it answers, else rabbitmqctl.
        """
        if self._connections_backend is None:
            if self.is_local_node or not self.uses_management_api:
                self._connections_backend = "rabbitmqctl"
            else:
                self._connections_backend = "api"
        return self._connections_backend

    def connections(self) -> list[dict[str, Any]]:
        """Open connections: ``{"name", "connection_name", "user", "state"}`` each.

        ``connection_name`` is the client-provided name (None if the client gave none).
        Through the management API a brand-new connection can take ~5 s to show, and a
        closed one stays listed as "closed" until its stats expire: those are left out.
        """
        return [
            {k: v for k, v in c.items() if k != "pid"}
            for c in self._connections()
            if c["state"] not in _GONE
        ]

    def _connections(self) -> list[dict[str, Any]]:
        if self.connections_backend == "api":
            rows = self._get("connections?columns=name,client_properties,user,state")
            return [
                {
                    "name": row.get("name"),
                    "connection_name": _connection_name(row.get("client_properties")),
                    "user": row.get("user"),
                    "state": row.get("state"),
                    "pid": None,
                }
                for row in rows or []
            ]
        out = self._ctl(
            "list_connections",
            "-q",
            "--no-table-headers",
            "pid",
            "name",
            "user",
            "state",
            "client_properties",
        ).stdout
        result = []
        for line in out.splitlines():
            fields = line.split("\t", 4)
            if len(fields) < 5:
                continue
            pid, name, user, state, props = fields
            result.append(
                {
                    "name": name,
                    "connection_name": _connection_name_from_ctl(props),
                    "user": user,
                    "state": state,
                    "pid": pid,
                }
            )
        return result

    def _matching(self, prefix: str) -> list[dict[str, Any]]:
        return [
            c
            for c in self._connections()
            if (c["connection_name"] or "").startswith(prefix) and c["state"] not in _GONE
        ]

    def _wait_matching(self, prefix: str, expect: int, deadline: float) -> list[dict[str, Any]]:
        found = self._matching(prefix)
        while len(found) < expect and time.monotonic() < deadline:
            time.sleep(0.25)
            found = self._matching(prefix)
        return found

    def wait_for_connections(
        self, connection_name_prefix: str, expect: int = 1, *, timeout: float = 15.0
    ) -> list[dict[str, Any]]:
        """Poll until at least *expect* open connections whose client-provided name starts
        with the prefix are listed (or *timeout* passes); return the ones listed."""
        found = self._wait_matching(connection_name_prefix, expect, time.monotonic() + timeout)
        return [{k: v for k, v in c.items() if k != "pid"} for c in found]

    def close_connections(
        self,
        connection_name_prefix: str,
        *,
        expect: int = 1,
        timeout: float = 20.0,
        reason: str = "closed by rmqdelay test",
    ) -> int:
        """Close every connection whose client-provided name starts with the prefix.

        Waits (up to *timeout*) for at least *expect* matching connections to be listed
        (the management API lags behind new connections), closes them all, then waits
        until the broker lists them as gone (absent, or closing/closed: a client that is
        not reading its socket keeps a closed connection listed until it answers or the
        broker's close timeout).  Returns how many were closed.  ``expect=0`` closes only
        what is listed right now.
        """
        if not connection_name_prefix:
            raise ValueError("refusing to close every connection: empty prefix")
        deadline = time.monotonic() + timeout
        found = self._wait_matching(connection_name_prefix, expect, deadline)
        if not found:
            return 0
        for conn in found:
            if conn["pid"]:
                self._ctl("close_connection", conn["pid"], reason, check=False)
            else:
                self._send(
                    "DELETE", f"connections/{self._q(conn['name'])}", headers={"X-Reason": reason}
                )
        names = {c["name"] for c in found}
        while True:
            remaining = {c["name"] for c in self._connections() if c["state"] not in _GONE} & names
            if not remaining:
                return len(names)
            if time.monotonic() >= deadline:
                raise BrokerAdminError(
                    f"{len(remaining)} connection(s) named {connection_name_prefix}* "
                    f"still open after {timeout:.0f}s"
                )
            time.sleep(0.25)

    # ----------------------------------------------------------------- users

    def add_user(
        self,
        name: str,
        password: str,
        configure: str,
        write: str,
        read: str,
        vhost: str = "/",
    ) -> None:
        """Create (or reset) user *name* with these permission regexes on *vhost*."""
        if self.uses_management_api:
            self._send("PUT", f"users/{self._q(name)}", {"password": password, "tags": ""})
            self._send(
                "PUT",
                f"permissions/{self._q(vhost)}/{self._q(name)}",
                {"configure": configure, "write": write, "read": read},
            )
            return
        proc = self._ctl("add_user", name, password, check=False)
        if proc.returncode != 0:
            if "already exists" not in (proc.stderr + proc.stdout):
                raise BrokerAdminError(
                    f"rabbitmqctl add_user exited {proc.returncode}: {proc.stderr.strip()[-300:]}"
                )
            self._ctl("change_password", name, password)
        self._ctl("set_permissions", "-p", vhost, name, configure, write, read)

    def clear_permissions(self, name: str, vhost: str = "/") -> None:
        """Take every permission of user *name* on *vhost* away (none set is fine)."""
        if self.uses_management_api:
            self._send("DELETE", f"permissions/{self._q(vhost)}/{self._q(name)}")
            return
        self._ctl("clear_permissions", "-p", vhost, name)

    def delete_user(self, name: str) -> None:
        """Delete user *name*; a missing user is fine."""
        if self.uses_management_api:
            self._send("DELETE", f"users/{self._q(name)}")
            return
        proc = self._ctl("delete_user", name, check=False)
        if proc.returncode != 0 and "does not exist" not in (proc.stderr + proc.stdout):
            raise BrokerAdminError(f"rabbitmqctl delete_user exited {proc.returncode}")

    def users(self) -> list[str]:
        if self.uses_management_api:
            return [u["name"] for u in self._get("users?columns=name")]
        return [row["user"] for row in self._ctl_json("list_users")]

    # ----------------------------------------------------------------- queues, exchanges

    def queues(self, vhost: str | None = None) -> list[str]:
        return self._names("queues", vhost)

    def exchanges(self, vhost: str | None = None) -> list[str]:
        return [name for name in self._names("exchanges", vhost) if name]  # "" is the default

    def _names(self, kind: str, vhost: str | None) -> list[str]:
        vhost = self.vhost if vhost is None else vhost
        if self.uses_management_api:
            rows = self._get(f"{kind}/{self._q(vhost)}?columns=name")
        else:
            rows = self._ctl_json(f"list_{kind}", "-p", vhost, "name")
        return [r["name"] for r in rows or []]

    def cleanup_prefix(self, prefix: str) -> dict[str, list[str]]:
        """Delete the queues, exchanges, policies and users named ``prefix`` or ``prefix.*``.

        Users are matched on ``prefix`` followed by anything.  Returns what was deleted.
        """
        if not prefix:
            raise ValueError("refusing to clean up with an empty prefix")
        queues = [q for q in self.queues() if matches_prefix(q, prefix)]
        exchanges = [x for x in self.exchanges() if matches_prefix(x, prefix)]
        if self.uses_management_api:
            # over HTTP: it still works when a starved broker stalls AMQP handshakes
            for kind, names in (("queues", queues), ("exchanges", exchanges)):
                for name in names:
                    self._send("DELETE", f"{kind}/{self._q(self.vhost)}/{self._q(name)}")
        else:
            if queues:
                delete_prefixed(self.amqp_url, queues, kind="queue")
            if exchanges:
                delete_prefixed(self.amqp_url, exchanges, kind="exchange")
        users = [u for u in self.users() if u.startswith(prefix)]
        for user in users:
            self.delete_user(user)
        policies: list[str] = []
        if self.uses_management_api:  # the x-delay bridge's, named like its inbox
            rows = self._get(f"policies/{self._q(self.vhost)}") or []
            policies = [p["name"] for p in rows if matches_prefix(p["name"], prefix)]
            for name in policies:
                self._send("DELETE", f"policies/{self._q(self.vhost)}/{self._q(name)}")
        return {"queues": queues, "exchanges": exchanges, "users": users, "policies": policies}


def _connection_name(props: Any) -> str | None:
    """client_properties.connection_name from the API (a dict) or rabbitmqctl's JSON
    (a list of ``[key, type, value]`` triples)."""
    if isinstance(props, dict):
        value = props.get("connection_name")
        return value if isinstance(value, str) else None
    if isinstance(props, list):
        for item in props:
            if isinstance(item, list) and len(item) == 3 and item[0] == "connection_name":
                return str(item[2])
    return None


_CTL_CONNECTION_NAME = re.compile(r'\{"connection_name","((?:[^"\\]|\\.)*)"\}')


def _connection_name_from_ctl(props: str) -> str | None:
    """connection_name out of rabbitmqctl's tab output: ``[{"connection_name","x"},...]``."""
    match = _CTL_CONNECTION_NAME.search(props)
    if match is None:
        return None
    try:
        return str(json.loads(f'"{match.group(1)}"'))
    except ValueError:
        return match.group(1)
