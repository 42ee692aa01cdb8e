#!/usr/bin/env python3
"""Find or start a RabbitMQ broker for rmqdelay's tests, demo and benchmarks.

Sources, tried in this order:

1. ``env``            -- ``$RMQDELAY_URL`` (must answer AMQP, else a hard error);
2. ``local``          -- something already listening on 127.0.0.1:5672 (guest/guest);
3. ``testcontainers`` -- ``rabbitmq:3.13-management`` in Docker, when a Docker engine answers.
                         The container lives only as long as the process that started it;
4. ``debian``         -- Debian's ``rabbitmq-server`` (installed with apt-get when missing
                         and we are root), started with ``rabbitmq-server -detached``.

Library use::

    from broker import ensure_broker
    with ensure_broker() as info:
        print(info.url, info.management_url, info.source)

Command line::

    python scripts/broker.py            # ensure a broker; print its URL on stdout
                                        # (nothing on stdout for testcontainers)
    python scripts/broker.py --check    # say which source would be used; start nothing
    python scripts/broker.py --run -- CMD ARGS...
                                        # run CMD with RMQDELAY_URL set (any source,
                                        # the container lives as long as CMD)

Only the standard library is required; pika, docker and testcontainers are used when
importable.  Passwords are never printed: diagnostics always show ``mask_url(url)``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_VAR = "RMQDELAY_URL"
LOCAL_HOST = "127.0.0.1"
LOCAL_PORT = 5672
LOCAL_URL = f"amqp://guest:guest@{LOCAL_HOST}:{LOCAL_PORT}/%2F"
MANAGEMENT_PORT = 15672
CONTAINER_IMAGE = "rabbitmq:3.13-management"
DEBIAN_SERVER = "/usr/sbin/rabbitmq-server"
MANAGEMENT_PLUGIN = "rabbitmq_management"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

START_TIMEOUT = 90.0  # seconds to wait for a freshly started broker
MANAGEMENT_TIMEOUT = 60.0  # seconds to wait for the management API after enabling it

SOURCES = ("env", "local", "testcontainers", "debian")

__all__ = [
    "BrokerInfo",
    "BrokerUnavailable",
    "SecretUrl",
    "amqp_ok",
    "ensure_broker",
    "main",
    "management_ok",
    "mask_url",
    "plan",
]


class BrokerUnavailable(RuntimeError):
    """No broker could be found or started; the message says what to do."""


class SecretUrl(str):
    """A URL string whose repr() masks the password (pytest prints fixture values' repr
    in failure tracebacks); str(), f-strings and comparisons give the real URL."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(mask_url(str(self)))


@dataclass(frozen=True)
class BrokerInfo:
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


# --------------------------------------------------------------------------- helpers


_quiet = False


def log(message: str) -> None:
    """Progress on stderr (silenced by --quiet)."""
    if not _quiet:
        print(f"[broker] {message}", file=sys.stderr, flush=True)


def _error(message: str) -> None:
    print(f"[broker] {message}", file=sys.stderr, flush=True)


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


def _password(url: str) -> str | None:
    try:
        return urllib.parse.urlsplit(url).password
    except ValueError:
        return None


def _scrub(text: str, url: str) -> str:
    """Remove the password of *url* from an error message, whatever its encoding."""
    text = text.replace(url, mask_url(url))
    raw = _password(url)
    if raw:
        for secret in {raw, urllib.parse.unquote(raw)}:
            if len(secret) >= 3:  # don't mangle messages over a one-letter password
                text = text.replace(secret, "***")
    return text


def _host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    default = 5671 if parts.scheme == "amqps" else 5672
    return parts.hostname or "localhost", parts.port or default


def _credentials(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    user = urllib.parse.unquote(parts.username) if parts.username is not None else "guest"
    pw = urllib.parse.unquote(parts.password) if parts.password is not None else "guest"
    return user, pw


def is_loopback(url: str) -> bool:
    try:
        return _host_port(url)[0] in LOOPBACK_HOSTS
    except ValueError:
        return False


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def tcp_open(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


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
            host, port = _host_port(url)
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
        return False, _scrub(detail, url)
    try:
        version = getattr(conn, "_impl").server_properties.get("version", b"?")  # noqa: B009
        if isinstance(version, bytes):
            version = version.decode(errors="replace")
    except Exception:
        version = "?"
    with contextlib.suppress(Exception):
        conn.close()
    return True, f"ok (RabbitMQ {version})"


def _http_get_json(url: str, user: str, password: str, timeout: float) -> Any:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    req = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)


def management_ok(management_url: str, amqp_url: str, timeout: float = 3.0) -> bool:
    """True when GET <management_url>/api/overview answers with the AMQP URL's credentials."""
    user, pw = _credentials(amqp_url)
    try:
        data = _http_get_json(f"{management_url.rstrip('/')}/api/overview", user, pw, timeout)
    except (OSError, ValueError):  # URLError/HTTPError are OSErrors; bad JSON is ValueError
        return False
    return isinstance(data, dict) and "rabbitmq_version" in data


def wait_for(predicate: Any, timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def docker_available(timeout: float = 15.0) -> tuple[bool, str]:
    """Does a Docker engine answer (``docker info`` or the docker SDK's ping)?"""
    why = "no docker CLI"
    if shutil.which("docker"):
        try:
            proc = subprocess.run(
                ["docker", "info", "--format", "{{.ServerVersion}}"],
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
            if proc.returncode == 0 and proc.stdout.strip():
                return True, f"Docker engine {proc.stdout.strip()}"
            why = "docker info failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"docker info failed: {exc}"
    try:
        import docker  # type: ignore[import-untyped,unused-ignore]

        client = docker.from_env(timeout=int(timeout))  # type: ignore[attr-defined,unused-ignore]
        try:
            if client.ping():
                return True, "Docker engine (SDK ping)"
        finally:
            client.close()
    except ImportError:
        pass
    except Exception as exc:  # DockerException and friends
        why += f"; SDK: {type(exc).__name__}"
    return False, why


def _testcontainers_importable() -> bool:
    try:
        _container_class()
    except ImportError:
        return False
    return True


def _container_class() -> Any:
    try:
        from testcontainers.community.rabbitmq import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
            RabbitMqContainer,
        )
    except ImportError:
        from testcontainers.rabbitmq import (  # type: ignore[import-not-found,import-untyped,unused-ignore]
            RabbitMqContainer,
        )
    return RabbitMqContainer


def _raise_nofile_limit(wanted: int = 65536) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _run(cmd: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run *cmd* with its output in a temporary file, not a pipe: a daemon it starts
    (``rabbitmq-server -detached``, epmd) may keep inherited pipes open for ever."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.run(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            check=False,
        )
        out.seek(0)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), "")


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Plan:
    source: str | None  # None: nothing can work
    detail: str


def plan() -> Plan:
    """Which source would ensure_broker() use?  Starts and installs nothing."""
    url = os.environ.get(ENV_VAR, "").strip()
    if url:
        ok, detail = amqp_ok(url)
        if ok:
            return Plan("env", f"${ENV_VAR} = {mask_url(url)}: {detail}")
        return Plan(None, f"${ENV_VAR} = {mask_url(url)} does not answer AMQP: {detail}")
    if tcp_open(LOCAL_HOST, LOCAL_PORT):
        return Plan(
            "local", f"something listens on {LOCAL_HOST}:{LOCAL_PORT} -> {mask_url(LOCAL_URL)}"
        )
    docker_ok, docker_detail = docker_available()
    if docker_ok and _testcontainers_importable():
        return Plan("testcontainers", f"{docker_detail}; would run {CONTAINER_IMAGE}")
    if Path(DEBIAN_SERVER).exists():
        return Plan("debian", f"would start {DEBIAN_SERVER} -detached")
    if _is_root() and shutil.which("apt-get"):
        return Plan("debian", "would apt-get install rabbitmq-server, then start it")
    return Plan(None, _help_text([f"docker: {docker_detail}"]))


def _help_text(errors: Sequence[str]) -> str:
    lines = ["No RabbitMQ broker could be found or started."]
    lines += [f"  - {e}" for e in errors]
    lines += [
        "Do one of these:",
        f"  * set {ENV_VAR}=amqp://USER:PASSWORD@HOST:5672/%2F to a broker you can reach;",
        "  * install and start Debian's broker: apt-get install -y rabbitmq-server && "
        "rabbitmq-server -detached (or run this script as root);",
        f"  * start a Docker engine (tests then run {CONTAINER_IMAGE} via testcontainers).",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- sources


def _from_env() -> BrokerInfo | None:
    url = os.environ.get(ENV_VAR, "").strip()
    if not url:
        return None
    ok, detail = amqp_ok(url)
    if not ok:
        raise BrokerUnavailable(
            f"${ENV_VAR} is set to {mask_url(url)} but it does not answer AMQP: {detail}\n"
            f"Fix the URL or start that broker, or unset {ENV_VAR} to let "
            "scripts/broker.py find or start one."
        )
    log(f"using ${ENV_VAR}: {mask_url(url)} ({detail})")
    return BrokerInfo(url=url, management_url=None, source="env")


def _from_local(errors: list[str]) -> BrokerInfo | None:
    if not tcp_open(LOCAL_HOST, LOCAL_PORT):
        return None
    # Something listens; a node that is still booting may refuse AMQP for a little while.
    last = ""
    deadline = time.monotonic() + 30.0
    while True:
        ok, last = amqp_ok(LOCAL_URL)
        if ok:
            log(f"using the broker on {LOCAL_HOST}:{LOCAL_PORT}: {mask_url(LOCAL_URL)} ({last})")
            return BrokerInfo(url=LOCAL_URL, management_url=None, source="local")
        if time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    raise BrokerUnavailable(
        f"something listens on {LOCAL_HOST}:{LOCAL_PORT} but {mask_url(LOCAL_URL)} "
        f"does not answer AMQP: {last}\n"
        f"Set {ENV_VAR} to the right URL (user, password, vhost) for that broker."
    )


@contextlib.contextmanager
def _from_testcontainers(errors: list[str]) -> Iterator[BrokerInfo | None]:
    """Yield a BrokerInfo for a fresh container, or None (reason appended to *errors*)."""
    try:
        cls = _container_class()
    except ImportError:
        errors.append("testcontainers is not installed (pip install 'testcontainers[rabbitmq]')")
        yield None
        return
    log(f"starting {CONTAINER_IMAGE} with testcontainers (first pull can take a while)")
    container = (
        cls(CONTAINER_IMAGE)
        .with_exposed_ports(MANAGEMENT_PORT)
        # stats every second (default 5 s): the management API then lists new and
        # closed connections sooner, which tests that close connections wait for
        .with_env("RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS", "-rabbit collect_statistics_interval 1000")
    )
    try:
        container.start()
        host = container.get_container_host_ip()
        port = int(container.get_exposed_port(container.port))
        mport = int(container.get_exposed_port(MANAGEMENT_PORT))
    except Exception as exc:
        errors.append(f"testcontainers failed: {type(exc).__name__}: {exc}")
        with contextlib.suppress(Exception):
            container.stop()
        yield None
        return
    try:
        user = urllib.parse.quote(container.username, safe="")
        pw = urllib.parse.quote(container.password, safe="")
        url = f"amqp://{user}:{pw}@{host}:{port}/%2F"
        candidate = f"http://{host}:{mport}"
        mgmt = (
            candidate
            if wait_for(lambda: management_ok(candidate, url), MANAGEMENT_TIMEOUT)
            else None
        )
        if mgmt is None:
            log("the container's management API did not answer: tests cannot administer it")
        log(f"container ready: {mask_url(url)}")
        yield BrokerInfo(url=url, management_url=mgmt, source="testcontainers")
    finally:
        log("stopping the RabbitMQ container")
        with contextlib.suppress(Exception):
            container.stop()


def _install_debian_server() -> None:
    log("rabbitmq-server is missing: apt-get update && apt-get install -y rabbitmq-server")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "rabbitmq-server"]):
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=2, env=env, timeout=900, check=False
        )
        if proc.returncode != 0:
            raise BrokerUnavailable(f"{' '.join(cmd)} failed with exit code {proc.returncode}")


def _from_debian(errors: list[str]) -> BrokerInfo | None:
    server = Path(DEBIAN_SERVER)
    if not server.exists():
        if not _is_root() or not shutil.which("apt-get"):
            errors.append(f"{DEBIAN_SERVER} is not installed (and we cannot apt-get it: not root)")
            return None
        try:
            _install_debian_server()
        except (BrokerUnavailable, OSError, subprocess.TimeoutExpired) as exc:
            errors.append(str(exc))
            return None
    # The package's postinst may already have started it.
    if not tcp_open(LOCAL_HOST, LOCAL_PORT):
        log(f"starting {DEBIAN_SERVER} -detached")
        try:
            # RabbitMQ's file handle cache sizes itself from the open-files limit: at the
            # usual 1024 a few hundred queues exhaust it and new connections hang in the
            # handshake. Raise the soft limit (up to the hard one) for the broker.
            _raise_nofile_limit()
            proc = _run([str(server), "-detached"], timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(f"rabbitmq-server -detached failed: {exc}")
            return None
        if proc.returncode != 0:
            errors.append(
                f"rabbitmq-server -detached exited {proc.returncode}: {proc.stdout.strip()[-500:]}"
            )
            return None
    log(f"waiting up to {START_TIMEOUT:.0f}s for the broker to answer AMQP")
    started = time.monotonic()
    last = ""

    def answers() -> bool:
        nonlocal last
        if not tcp_open(LOCAL_HOST, LOCAL_PORT):
            last = "port closed"
            return False
        ok, last = amqp_ok(LOCAL_URL, timeout=3.0)
        return ok

    if not wait_for(answers, START_TIMEOUT, interval=1.0):
        errors.append(
            f"rabbitmq-server was started but did not answer within {START_TIMEOUT:.0f}s "
            f"({last}); see /var/log/rabbitmq/"
        )
        return None
    log(f"broker up after {time.monotonic() - started:.1f}s: {mask_url(LOCAL_URL)}")
    return BrokerInfo(url=LOCAL_URL, management_url=None, source="debian")


# --------------------------------------------------------------------------- management


def _enabled_plugins_file() -> Path:
    return Path(os.environ.get("RABBITMQ_ENABLED_PLUGINS_FILE", "/etc/rabbitmq/enabled_plugins"))


def _management_enabled_in_file() -> bool:
    try:
        text = _enabled_plugins_file().read_text()
    except OSError:
        return False
    return re.search(rf"\b{MANAGEMENT_PLUGIN}\b", text) is not None


def _ensure_local_management(url: str, source: str) -> str | None:
    """Return the management URL of a broker on this machine, enabling the plugin if needed.

    Only for a broker on the loopback interface (sources "local", "debian", or "env"
    pointing at 127.0.0.1:5672, which is the same node).  Returns None when the API
    cannot be had; callers then fall back to rabbitmqctl.
    """
    host, port = _host_port(url)
    mgmt = f"http://{host}:{MANAGEMENT_PORT}"
    if management_ok(mgmt, url):
        return mgmt
    local_node = host in LOOPBACK_HOSTS and (source in ("local", "debian") or port == LOCAL_PORT)
    plugins = shutil.which("rabbitmq-plugins")
    if not local_node or not plugins or not _is_root():
        return None
    started = time.monotonic()
    if not _management_enabled_in_file():
        log(f"enabling {MANAGEMENT_PLUGIN} on the local node (takes a few seconds)")
        try:
            proc = _run([plugins, "enable", MANAGEMENT_PLUGIN], timeout=180)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log(f"rabbitmq-plugins enable failed: {exc}; falling back to rabbitmqctl")
            return None
        if proc.returncode != 0:
            tail = proc.stdout.strip().splitlines()[-3:]
            log(f"rabbitmq-plugins enable exited {proc.returncode}: {' | '.join(tail)}")
            return None
    if wait_for(lambda: management_ok(mgmt, url), MANAGEMENT_TIMEOUT):
        log(f"management API answers at {mgmt} ({time.monotonic() - started:.1f}s)")
        return mgmt
    log(f"management API at {mgmt} did not answer; falling back to rabbitmqctl")
    return None


def _with_management(info: BrokerInfo) -> BrokerInfo:
    if info.management_url is not None:
        return info
    mgmt: str | None
    if info.source in ("local", "debian") or is_loopback(info.url):
        mgmt = _ensure_local_management(info.url, info.source)
    else:
        host, _ = _host_port(info.url)
        candidate = f"http://{host}:{MANAGEMENT_PORT}"
        mgmt = candidate if management_ok(candidate, info.url, timeout=2.0) else None
    return BrokerInfo(url=info.url, management_url=mgmt, source=info.source)


# --------------------------------------------------------------------------- API


@contextlib.contextmanager
def ensure_broker(
    *, allow_testcontainers: bool = True, allow_start: bool = True, management: bool = True
) -> Iterator[BrokerInfo]:
    """Find or start a broker (see the module docstring for the order).

    Raises BrokerUnavailable with instructions when none can be had.  With a
    testcontainers broker the container is stopped when the ``with`` block ends.
    ``allow_testcontainers=False`` skips Docker; ``allow_start=False`` skips starting
    or installing Debian's server.
    """
    errors: list[str] = []
    info = _from_env() or _from_local(errors)
    if info is None and allow_testcontainers:
        docker_ok, docker_detail = docker_available()
        if docker_ok:
            with _from_testcontainers(errors) as container_info:
                if container_info is not None:
                    yield container_info
                    return
        else:
            errors.append(f"docker: {docker_detail}")
    if info is None and allow_start:
        info = _from_debian(errors)
    if info is None:
        raise BrokerUnavailable(_help_text(errors))
    if management:
        info = _with_management(info)
    yield info


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    global _quiet
    parser = argparse.ArgumentParser(
        prog="broker.py",
        description="Find or start a RabbitMQ broker (env, local, testcontainers, debian). "
        "Prints its URL on stdout; diagnostics (masked URLs) go to stderr.",
    )
    parser.add_argument(
        "--check", action="store_true", help="say which source would be used; start nothing"
    )
    parser.add_argument(
        "--run",
        action="store_true",
        help="--run -- CMD ARGS...: run CMD with RMQDELAY_URL set to the broker "
        "(a container lives as long as CMD)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="print only errors on stderr")
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:  # everything after "--" is the command for --run
        split = argv.index("--")
        argv, command = argv[:split], argv[split + 1 :]
    args = parser.parse_args(argv)
    _quiet = args.quiet
    if args.check and args.run:
        parser.error("--check and --run are exclusive")
    if command and not args.run:
        parser.error("a command after -- needs --run")

    if args.check:
        p = plan()
        if p.source is None:
            _error(p.detail)
            return 1
        print(f"{p.source}: {p.detail}")
        return 0

    try:
        if args.run:
            if not command:
                parser.error("--run needs a command after --")
            with ensure_broker() as info:
                log(f"source={info.source} url={info.masked_url}; running {' '.join(command)}")
                return subprocess.call(command, env=dict(os.environ, **{ENV_VAR: info.url}))

        # A container would die with this process: on a Docker-only machine say so and
        # succeed; pytest's broker fixture (or --run) starts the container.
        if not os.environ.get(ENV_VAR, "").strip() and not tcp_open(LOCAL_HOST, LOCAL_PORT):
            docker_ok, docker_detail = docker_available()
            if docker_ok and _testcontainers_importable():
                log(f"source=testcontainers ({docker_detail}): pytest's broker fixture starts it")
                return 0
        with ensure_broker(allow_testcontainers=False) as info:
            log(f"source={info.source} url={info.masked_url} management={info.management_url}")
            print(info.url, flush=True)  # unmasked, for $(...) in shells
        return 0
    except BrokerUnavailable as exc:
        _error(str(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
