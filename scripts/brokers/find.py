"""Which broker answers AMQP, and the order the sources are tried in.

1. ``env``            -- ``$RMQDELAY_URL`` (must answer AMQP, else a hard error);
2. ``local``          -- something already listening on 127.0.0.1:5672 (guest/guest);
                         this machine's node, when it allows too few open files for a
                         suite (Debian's 1024), is restarted with more (as root);
3. ``testcontainers`` -- a container, when a Docker engine answers (see container.py);
4. ``debian``         -- Debian's ``rabbitmq-server``, installed with apt-get when missing
                         and we are root, then started (see debian.py).  When something
                         listens on 5672 yet does not answer AMQP (a wedged node: seen
                         here), a node of our own on 127.0.0.1:5674 (management 15674,
                         data under /var/tmp/rmqdelay-own) instead; it keeps running.

The tests' harness also wants the management API: on a broker of this machine it may
enable the plugin, and says so first when that broker is not one this module started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import container, debian
from .base import (
    LOOPBACK_HOSTS,
    BrokerInfo,
    BrokerUnavailable,
    host_port,
    is_loopback,
    log,
    mask_url,
    notice,
)
from .probe import amqp_ok, listener_pid, management_ok, open_files_limit, tcp_open, wait_for

__all__ = ["ENV_VAR", "SOURCES", "Plan", "ensure_broker", "local_url", "plan"]

ENV_VAR = "RMQDELAY_URL"
LOCAL_HOST = "127.0.0.1"
LOCAL_PORT = 5672
OWN_PORT = 5674  # our own node, when the one on LOCAL_PORT listens but does not answer
OWN_BASE = Path(os.environ.get("RMQDELAY_OWN_BROKER_DIR", "/var/tmp/rmqdelay-own"))
LOCAL_ANSWER_WAIT = 20.0  # seconds a listening node on LOCAL_PORT gets to answer AMQP
MANAGEMENT_PORT = 15672
MANAGEMENT_PLUGIN = "rabbitmq_management"
MANAGEMENT_ENV_VAR = "RMQDELAY_MANAGEMENT_URL"
MANAGEMENT_TIMEOUT = 60.0  # seconds to wait for the management API after enabling it
SOURCES = ("env", "local", "testcontainers", "debian")


def local_url() -> str:
    return f"amqp://guest:guest@{LOCAL_HOST}:{LOCAL_PORT}/%2F"


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
            "local",
            f"something listens on {LOCAL_HOST}:{LOCAL_PORT} -> {mask_url(local_url())} "
            f"(if it does not answer AMQP: a node of our own on :{OWN_PORT})",
        )
    docker_ok, docker_detail = container.docker_available()
    if docker_ok and container.testcontainers_importable():
        return Plan("testcontainers", f"{docker_detail}; would run {container.CONTAINER_IMAGE}")
    if Path(debian.DEBIAN_SERVER).exists():
        return Plan("debian", f"would start {debian.DEBIAN_SERVER} -detached")
    if debian.can_install():
        return Plan("debian", "would apt-get install rabbitmq-server, then start it")
    return Plan(None, help_text([f"docker: {docker_detail}"]))


def help_text(errors: Sequence[str]) -> str:
    lines = ["No RabbitMQ broker could be found or started."]
    lines += [f"  - {e}" for e in errors]
    lines += [
        "Do one of these:",
        f"  * set {ENV_VAR}=amqp://USER:PASSWORD@HOST:5672/%2F to a broker you can reach;",
        "  * install and start Debian's broker: apt-get install -y rabbitmq-server && "
        "rabbitmq-server -detached (or run this script as root);",
        f"  * start a Docker engine (tests then run {container.CONTAINER_IMAGE} via "
        "testcontainers).",
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
    """The broker on 127.0.0.1:5672, or None (with why in ``errors``) when nothing there
    answers AMQP: a node that is still booting gets :data:`LOCAL_ANSWER_WAIT` seconds."""
    if not tcp_open(LOCAL_HOST, LOCAL_PORT):
        return None
    url, last = local_url(), ""
    deadline = time.monotonic() + LOCAL_ANSWER_WAIT
    while True:
        ok, last = amqp_ok(url)
        if ok and not _raise_local_limit(errors):
            return None
        if ok:
            log(f"using the broker on {LOCAL_HOST}:{LOCAL_PORT}: {mask_url(url)} ({last})")
            return BrokerInfo(url=url, management_url=None, source="local")
        if time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    errors.append(
        f"something listens on {LOCAL_HOST}:{LOCAL_PORT} but {mask_url(url)} does not "
        f"answer AMQP: {last} (set {ENV_VAR} if it wants another user, password or vhost)"
    )
    log(errors[-1])
    return None


def _raise_local_limit(errors: list[str]) -> bool:
    """False when the node on :data:`LOCAL_PORT` allows too few open files for a suite and
    cannot be restarted with more (then a node of our own serves instead).

    RabbitMQ 3.10 reads the limit once, at boot, and each quorum queue reserves file
    handles: at 1024 (Debian's default through su) a few hundred queues, two suites'
    topologies or a benchmark's, leave every new connection waiting in the handshake.
    The system node of this machine, as root, is restarted with :data:`debian.OPEN_FILES`.
    """
    pid, limit = _local_limit()
    if limit is None or limit >= debian.ENOUGH_OPEN_FILES:
        return True
    why = (
        f"the broker on {LOCAL_HOST}:{LOCAL_PORT} allows {limit} open files; its quorum queues "
        "reserve file handles, and a few hundred of them leave new connections waiting in "
        "the handshake"
    )
    if not (debian.is_root() and _is_beam(pid) and Path(debian.DEBIAN_SERVER).exists()):
        log(f"{why}: a suite may hang (restart it with `ulimit -n {debian.OPEN_FILES}`)")
        return True
    with _restart_lock():  # pytest-xdist workers each look: one restarts, the rest see it
        limit = _local_limit()[1]
        if limit is not None and limit >= debian.ENOUGH_OPEN_FILES:
            return True
        notice(f"{why}: restarting this machine's node with up to {debian.OPEN_FILES}")
        try:
            took = debian.restart_node(debian.system_node(port=LOCAL_PORT, host=LOCAL_HOST))
        except BrokerUnavailable as exc:
            errors.append(f"{why}, and restarting it failed: {exc}")
            log(errors[-1])
            return False
    log(f"restarted in {took:.1f}s; it allows {_local_limit()[1]} open files")
    return True


def _local_limit() -> tuple[int | None, int | None]:
    """The pid listening on :data:`LOCAL_PORT` and its open-files limit (None: unknown)."""
    pid = listener_pid(LOCAL_PORT)
    return pid, None if pid is None else open_files_limit(pid)


@contextlib.contextmanager
def _restart_lock() -> Iterator[None]:
    import fcntl

    with open(f"{debian.SYSTEM_ENV_FILE}.lock", "a") as lock:  # as root: /var/tmp
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _is_beam(pid: int | None) -> bool:
    with contextlib.suppress(OSError):
        return pid is not None and b"beam.smp" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return False


def _restart_wedged(node: debian.DebianNode) -> None:
    """Our own node listens but does not answer AMQP (RabbitMQ 3.10.8 was seen so, its
    connections stuck in the file handle cache): kill its VM so that it starts afresh.
    Its queues are the tests' and benchmarks', which clean up after themselves."""
    log(f"{node.label} listens but does not answer AMQP: killing it to start it again")
    wanted = f"RABBITMQ_NODENAME={node.node_name}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if _is_beam(int(entry.name)) and wanted in (entry / "environ").read_bytes().split(
                b"\0"
            ):
                os.kill(int(entry.name), signal.SIGKILL)
    if not wait_for(lambda: not tcp_open(node.host, node.port), 30.0):
        raise BrokerUnavailable(f"{node.label} did not stop after kill -9")


def own_node() -> debian.DebianNode:
    """Our own node beside a wedged one on :5672, its files under :data:`OWN_BASE`."""
    OWN_BASE.mkdir(parents=True, exist_ok=True)
    os.chmod(OWN_BASE, 0o755)  # the rabbitmq user must reach the node's directories
    return debian.DebianNode.scratch(
        OWN_BASE, "rmqd-own", OWN_PORT, management_port=OWN_PORT + MANAGEMENT_PORT - LOCAL_PORT
    )


def _from_debian(errors: list[str], *, own: bool = False) -> BrokerInfo | None:
    """Debian's node on :5672, or (``own``: :5672 is taken) our own on :data:`OWN_PORT`."""
    if not Path(debian.DEBIAN_SERVER).exists():
        if not debian.can_install():
            errors.append(
                f"{debian.DEBIAN_SERVER} is not installed (and we cannot apt-get it: not root)"
            )
            return None
        try:
            debian.install_server()
        except (BrokerUnavailable, OSError) as exc:
            errors.append(str(exc))
            return None
    node = own_node() if own else debian.system_node(port=LOCAL_PORT, host=LOCAL_HOST)
    try:
        if own and tcp_open(node.host, node.port) and not amqp_ok(node.url, timeout=10.0)[0]:
            _restart_wedged(node)  # ours: restart it rather than fail
        if tcp_open(node.host, node.port):  # the package's postinst may have started it
            took = debian.wait_until_up(node)
        else:
            took = debian.start_node(node)
    except BrokerUnavailable as exc:
        errors.append(str(exc))
        return None
    log(f"broker up after {took:.1f}s: {mask_url(node.url)}")
    return BrokerInfo(url=node.url, management_url=None, source="debian")


# --------------------------------------------------------------------------- management


def _ensure_local_management(info: BrokerInfo) -> str | None:
    """The management URL of a broker on this machine, enabling the plugin if needed.

    Only for the node on the loopback interface at the default port.  Enabling it on a
    broker this module did not start is announced first.  Returns None when the API
    cannot be had; callers then fall back to rabbitmqctl.
    """
    host, port = host_port(info.url)
    mgmt = f"http://{host}:{MANAGEMENT_PORT}"
    if management_ok(mgmt, info.url):
        return mgmt
    node = debian.system_node(port=LOCAL_PORT, host=LOCAL_HOST)
    local_node = host in LOOPBACK_HOSTS and port == LOCAL_PORT
    if not (local_node and debian.is_root() and debian.has_tool(node, "rabbitmq-plugins")):
        return None
    started = time.monotonic()
    if not debian.plugin_listed(node, MANAGEMENT_PLUGIN):
        if info.source == "debian":
            log(f"enabling {MANAGEMENT_PLUGIN} on the node we started (takes a few seconds)")
        else:
            notice(
                f"enabling the {MANAGEMENT_PLUGIN} plugin on the broker at {host}:{port} "
                f"(source {info.source}: already running, not started by scripts/broker.py), "
                "because the tests list connections, users and bindings through its HTTP API "
                f"on :{MANAGEMENT_PORT}. Undo: rabbitmq-plugins disable {MANAGEMENT_PLUGIN}. "
                "Avoid: scripts/broker.py --no-management"
            )
        ok, detail = debian.enable_plugins(node, MANAGEMENT_PLUGIN)
        if not ok:
            log(f"{detail}; falling back to rabbitmqctl")
            return None
    if wait_for(lambda: management_ok(mgmt, info.url), MANAGEMENT_TIMEOUT):
        log(f"management API answers at {mgmt} ({time.monotonic() - started:.1f}s)")
        return mgmt
    log(f"management API at {mgmt} did not answer; falling back to rabbitmqctl")
    return None


def _with_management(info: BrokerInfo) -> BrokerInfo:
    if info.management_url is not None:
        return info
    mgmt: str | None
    explicit = os.environ.get(MANAGEMENT_ENV_VAR, "").strip()
    if explicit:  # a broker on another port has its API elsewhere too: never guess then
        mgmt = explicit if management_ok(explicit, info.url, timeout=5.0) else None
        if mgmt is None:
            log(f"${MANAGEMENT_ENV_VAR} ({explicit}) does not answer; using rabbitmqctl")
        return BrokerInfo(url=info.url, management_url=mgmt, source=info.source)
    host, port = host_port(info.url)
    if is_loopback(info.url) and port != LOCAL_PORT:
        # another broker of this machine (make test-rmq43 on :5683, the cluster on :5721):
        # :15672 is the API of the one on :5672, so only its own port + 10000 will do
        candidate = f"http://{host}:{port + MANAGEMENT_PORT - LOCAL_PORT}"
        ok = management_ok(candidate, info.url, timeout=2.0, amqp_port=port)
        mgmt = candidate if ok else None
        if mgmt is None:
            log(f"no management API of {host}:{port} at {candidate}; set ${MANAGEMENT_ENV_VAR}")
    elif info.source in ("local", "debian") or is_loopback(info.url):
        mgmt = _ensure_local_management(info)
    else:
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
    or installing Debian's server; ``management=False`` neither looks for nor enables
    the management API.
    """
    errors: list[str] = []
    info = _from_env() or _from_local(errors)
    if info is None and allow_testcontainers:
        docker_ok, docker_detail = container.docker_available()
        if docker_ok:
            with container.run_container(errors, MANAGEMENT_TIMEOUT) as container_info:
                if container_info is not None:
                    yield container_info
                    return
        else:
            errors.append(f"docker: {docker_detail}")
    if info is None and allow_start:
        info = _from_debian(errors, own=tcp_open(LOCAL_HOST, LOCAL_PORT))
    if info is None:
        raise BrokerUnavailable(help_text(errors))
    if management:
        info = _with_management(info)
    yield info
