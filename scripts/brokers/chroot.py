"""RabbitMQ 4.x from a newer Debian release, in a debootstrap chroot, on its own ports.

The host runs Debian bookworm's 3.10; newer releases run beside it without Docker, one
chroot per :class:`Release` (the table :data:`RELEASES`):

* ``rmq4``: RabbitMQ 4.0 (Debian trixie, Erlang 27): node ``rmqd-rmq4@localhost``,
  AMQP 127.0.0.1:5682, management :15682, distribution port 25682;
* ``rmq43``: RabbitMQ 4.3 (Debian sid, Erlang 29): node ``rmqd-rmq43@localhost``,
  AMQP 127.0.0.1:5683, management :15683, distribution port 25683. Sid's Release file
  on the mirror is a snapshot that counts as expired, so apt-get update is told not to
  check its date.

A chroot is built once (about 40 s: debootstrap, then apt-get install rabbitmq-server)
and kept under its release's root (``$RMQDELAY_RMQ4_ROOT``, ``$RMQDELAY_RMQ43_ROOT``).
The default node is configured inside the chroot (``/etc/rabbitmq``), so every tool run
there aims at it with no environment to pass. Every start copies the host's /etc/hosts
in (without it ``localhost`` does not resolve in sid and the node hangs at boot, saying
nothing) and mounts /proc and /dev. The host's epmd serves every Erlang version.

Nodes start with ``rabbitmq-server -detached`` (:func:`.debian.start_node`), launched in
a session of their own: on 4.3.6 too, the detached VM leaves the starting session
(setsid) and is reparented to init, so it outlives the shell that started it.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .base import BrokerUnavailable, log, run_captured
from .debian import DEBIAN_SERVER, DebianNode, start_node
from .probe import amqp_ok, tcp_open, wait_for

__all__ = [
    "RELEASES",
    "Release",
    "chroot_pids",
    "ensure_chroot",
    "prepare_chroot",
    "release",
    "release_chroot",
    "running",
    "start",
    "stop",
]

MANAGEMENT_OFFSET = 10000  # as for every broker of this machine: 5682 -> 15682
DIST_OFFSET = 20000


def _cache_base() -> Path:
    """Only root can build and enter a chroot, so its cache is the system's (FHS); anyone
    else's would be their XDG cache."""
    if os.geteuid() == 0:
        return Path("/var/cache")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


@dataclass(frozen=True)
class Release:
    """One RabbitMQ release from one Debian suite, its chroot and its single node."""

    name: str  # "rmq4": broker.py's subcommand, make's test-NAME and NAME-stop
    version: str  # "4.0", for messages
    suite: str  # the Debian suite debootstrap installs
    amqp_port: int
    apt_update_options: tuple[str, ...] = ()

    @property
    def root_env(self) -> str:
        return f"RMQDELAY_{self.name.upper()}_ROOT"

    @property
    def root(self) -> Path:
        """The chroot: ``$RMQDELAY_<NAME>_ROOT``, else rabbitmq<N>-<suite> in the cache."""
        explicit = os.environ.get(self.root_env, "").strip()
        dirname = f"rabbitmq{self.name.removeprefix('rmq')}-{self.suite}"
        return Path(explicit) if explicit else _cache_base() / "rmqdelay" / dirname

    @property
    def node_name(self) -> str:
        return f"rmqd-{self.name}@localhost"

    @property
    def management_port(self) -> int:
        return self.amqp_port + MANAGEMENT_OFFSET

    @property
    def dist_port(self) -> int:
        return self.amqp_port + DIST_OFFSET

    @property
    def url(self) -> str:
        """guest/guest: the default user, allowed from loopback only."""
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"

    def config(self) -> dict[str, str]:
        """The default node's files inside the chroot."""
        return {
            "etc/rabbitmq/rabbitmq.conf": (
                f"listeners.tcp.1 = 127.0.0.1:{self.amqp_port}\n"
                "management.tcp.ip = 127.0.0.1\n"
                f"management.tcp.port = {self.management_port}\n"
            ),
            "etc/rabbitmq/enabled_plugins": "[rabbitmq_management].\n",
            "etc/rabbitmq/rabbitmq-env.conf": (
                f"NODENAME={self.node_name}\nDIST_PORT={self.dist_port}\n"
            ),
        }

    def node(self) -> DebianNode:
        """The chroot's default node, as debian.start_node starts it."""
        return DebianNode(
            port=self.amqp_port,
            server=DEBIAN_SERVER,
            command_prefix=("chroot", str(self.root)),
        )


RELEASES = {
    "rmq4": Release("rmq4", "4.0", "trixie", 5682),
    "rmq43": Release(
        "rmq43", "4.3", "sid", 5683, apt_update_options=("-o", "Acquire::Check-Valid-Until=false")
    ),
}


def release(name: str) -> Release:
    """The release called *name* (``rmq4``, ``rmq43``); BrokerUnavailable names the others."""
    try:
        return RELEASES[name]
    except KeyError:
        raise BrokerUnavailable(
            f"no RabbitMQ release {name!r}: say one of {', '.join(RELEASES)}"
        ) from None


_SERVER = "usr/lib/rabbitmq/bin/rabbitmq-server"
_LIMITS = "etc/security/limits.d/rabbitmq.conf"


def _nofile_limits() -> str:
    """The package's wrapper starts the node through su, whose pam_limits cuts the soft
    open-files limit to 1024: too few for the suite's queues and connections. Ask for
    our hard limit (a container may not raise it)."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
    return f"rabbitmq soft nofile {wanted}\n"


def _run(cmd: list[str], timeout: float) -> None:
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    proc = run_captured(cmd, timeout, env)
    if proc.returncode != 0:
        tail = " | ".join(proc.stdout.strip().splitlines()[-5:])
        raise BrokerUnavailable(f"{' '.join(cmd)} exited {proc.returncode}: {tail}")


def ensure_chroot(rel: Release) -> float:
    """Build *rel*'s chroot unless it is there; return the seconds spent building it."""
    root = rel.root
    if (root / _SERVER).exists():
        return 0.0
    started = time.monotonic()
    if shutil.which("debootstrap") is None:
        log("installing debootstrap (apt-get)")
        _run(["apt-get", "update", "-qq"], 600)
        _run(["apt-get", "install", "-y", "-qq", "debootstrap"], 600)
    building = root.with_name(root.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    log(
        f"building a Debian {rel.suite} chroot for RabbitMQ {rel.version} in {root} "
        "(once; about a minute)"
    )
    _run(["debootstrap", "--variant=minbase", rel.suite, str(building)], 900)
    # no service may start inside the chroot while it is built (Debian's convention)
    policy = building / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    _run(["chroot", str(building), "apt-get", *rel.apt_update_options, "update", "-qq"], 600)
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "rabbitmq-server"]
    _run(["chroot", str(building), *install], 900)
    for vm in _pids_in(building):  # in case a package's script started one anyway
        os.kill(vm, signal.SIGKILL)
    building.rename(root)
    log(f"chroot ready in {time.monotonic() - started:.0f}s")
    return time.monotonic() - started


def _mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)], check=False).returncode == 0


def _mount(root: Path) -> None:
    for fs, target in (("proc", root / "proc"), ("dev", root / "dev")):
        target.mkdir(exist_ok=True)
        if not _mounted(target):
            cmd = ["mount", "-t", "proc", "proc"] if fs == "proc" else ["mount", "--bind", "/dev"]
            _run([*cmd, str(target)], 30)


def _copy_hosts(root: Path) -> None:
    """The host's /etc/hosts: without ``localhost`` in it a node named @localhost hangs
    at boot (sid's debootstrap writes none)."""
    hosts = Path("/etc/hosts").read_bytes()
    target = root / "etc/hosts"
    if not target.exists() or target.read_bytes() != hosts:
        target.write_bytes(hosts)


def _pids_in(root: Path) -> list[int]:
    """Processes whose root is *root*: its nodes, and anything they left running."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "root")) == root:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def chroot_pids(rel: Release) -> list[int]:
    """Every process running in *rel*'s chroot (any node of it, its epmd, its CLI)."""
    return _pids_in(rel.root)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _stop_own_epmd(rel: Release) -> None:
    """An epmd a node started inside the chroot (none ran on the host) outlives it and
    keeps /dev busy: end it once no node is registered with it."""
    pids = chroot_pids(rel)
    epmds = [pid for pid in pids if _comm(pid) == "epmd"]
    if not epmds or pids != epmds:
        return
    if "name " in run_captured(["chroot", str(rel.root), "epmd", "-names"], 10).stdout:
        return
    for pid in epmds:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def prepare_chroot(rel: Release) -> None:
    """What any node in the chroot needs (its single node, or a cluster of cluster.py):
    the chroot built, the host's /etc/hosts, the rabbitmq user's open-files limit, /proc
    and /dev mounted."""
    ensure_chroot(rel)
    root = rel.root
    _copy_hosts(root)
    (root / _LIMITS).parent.mkdir(parents=True, exist_ok=True)
    (root / _LIMITS).write_text(_nofile_limits())
    _mount(root)


def release_chroot(rel: Release) -> bool:
    """Once nothing runs in the chroot (an epmd of its own is ended), unmount /proc and
    /dev; True when it was left empty and unmounted, False while a node still runs."""
    _stop_own_epmd(rel)
    if chroot_pids(rel):
        return False
    for target in (rel.root / "proc", rel.root / "dev"):
        if _mounted(target):
            _run(["umount", str(target)], 30)
    return True


def _ctl(rel: Release, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_captured(["chroot", str(rel.root), "rabbitmqctl", *args], timeout)


def running(rel: Release) -> bool:
    """Does *rel*'s node answer AMQP?"""
    return tcp_open("127.0.0.1", rel.amqp_port) and amqp_ok(rel.url, timeout=3.0)[0]


def start(rel: Release, timeout: float = 120.0) -> str:
    """Start *rel*'s node unless it answers already; return its AMQP URL."""
    ensure_chroot(rel)
    if running(rel):
        return rel.url
    for relative, text in rel.config().items():
        (rel.root / relative).parent.mkdir(parents=True, exist_ok=True)
        (rel.root / relative).write_text(text)
    prepare_chroot(rel)
    log(f"starting RabbitMQ {rel.version} ({rel.node_name}) in {rel.root}")
    try:
        start_node(rel.node(), timeout)
    except BrokerUnavailable as exc:
        raise BrokerUnavailable(f"{exc} (in {rel.root})") from None
    # the management API starts a moment after AMQP; the tests need it
    _ctl(rel, "await_startup", timeout=timeout)
    return rel.url


def stop(rel: Release) -> bool:
    """Stop *rel*'s node (if running) and unmount; True when nothing of it is left."""
    if (rel.root / _SERVER).exists() and tcp_open("127.0.0.1", rel.amqp_port):
        proc = _ctl(rel, "stop")
        if proc.returncode != 0:
            log(f"rabbitmqctl stop exited {proc.returncode}: {proc.stdout.strip()[-300:]}")
        wait_for(lambda: not tcp_open("127.0.0.1", rel.amqp_port), 60)

    # the port closes before the VM has exited: unmount only once nothing runs in there
    # (a cluster of cluster.py may run in the same chroot: its VMs count as left)
    def gone() -> bool:
        _stop_own_epmd(rel)
        return not _node_pids(rel)

    stopped = wait_for(gone, 60)
    if not stopped:
        log(f"still running in {rel.root}: {_node_pids(rel)}; left mounted")
    elif not release_chroot(rel):
        log(f"other processes run in {rel.root} ({chroot_pids(rel)}): left mounted")
    return stopped


def _node_pids(rel: Release) -> list[int]:
    """*rel*'s single node: the chroot's processes whose environment does not name a node
    of its own (a cluster's VMs and their CLI carry RABBITMQ_NODENAME)."""
    own = []
    for pid in chroot_pids(rel):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if not any(v.startswith(b"RABBITMQ_NODENAME=") for v in environ):
            own.append(pid)
    return own
