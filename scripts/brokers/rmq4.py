"""RabbitMQ 4.0 (Debian trixie's package, Erlang 27) in a debootstrap chroot, on its own ports.

The host runs Debian bookworm's 3.10; trixie's 4.0 runs beside it without Docker: the
chroot is built once (about 40 s: debootstrap, then apt-get install rabbitmq-server) and
kept under :data:`ROOT`. Its default node is configured inside the chroot
(``/etc/rabbitmq``), so every tool run there aims at it with no environment to pass:
node ``rmqd-rmq4@localhost``, AMQP on 127.0.0.1:5682, management on 127.0.0.1:15682,
distribution port 25682. The host's epmd serves both Erlang versions.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .base import BrokerUnavailable, log, run_captured
from .probe import amqp_ok, tcp_open, wait_for

__all__ = [
    "AMQP_PORT",
    "MANAGEMENT_PORT",
    "ROOT",
    "URL",
    "chroot_pids",
    "ensure_chroot",
    "prepare_chroot",
    "release_chroot",
    "start",
    "stop",
]


def _default_root() -> Path:
    """Only root can build and enter a chroot, so its cache is the system's (FHS); anyone
    else's would be their XDG cache."""
    if os.geteuid() == 0:
        base = Path("/var/cache")
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "rmqdelay" / "rabbitmq4-trixie"


ROOT = Path(os.environ.get("RMQDELAY_RMQ4_ROOT") or _default_root())
"""The chroot; set RMQDELAY_RMQ4_ROOT to keep it elsewhere. Reused when present."""
AMQP_PORT = 5682
MANAGEMENT_PORT = 15682
DIST_PORT = 25682
NODE = "rmqd-rmq4@localhost"
URL = f"amqp://guest:guest@127.0.0.1:{AMQP_PORT}/%2F"
MANAGEMENT_URL = f"http://127.0.0.1:{MANAGEMENT_PORT}"
_SERVER = "usr/lib/rabbitmq/bin/rabbitmq-server"
_CONFIG = {
    "etc/rabbitmq/rabbitmq.conf": (
        f"listeners.tcp.1 = 127.0.0.1:{AMQP_PORT}\n"
        "management.tcp.ip = 127.0.0.1\n"
        f"management.tcp.port = {MANAGEMENT_PORT}\n"
    ),
    "etc/rabbitmq/enabled_plugins": "[rabbitmq_management].\n",
    "etc/rabbitmq/rabbitmq-env.conf": f"NODENAME={NODE}\nDIST_PORT={DIST_PORT}\n",
}
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


def ensure_chroot() -> float:
    """Build the chroot unless it is there; return the seconds spent building it."""
    if (ROOT / _SERVER).exists():
        return 0.0
    started = time.monotonic()
    if shutil.which("debootstrap") is None:
        log("installing debootstrap (apt-get)")
        _run(["apt-get", "update", "-qq"], 600)
        _run(["apt-get", "install", "-y", "-qq", "debootstrap"], 600)
    building = ROOT.with_name(ROOT.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    log(f"building a Debian trixie chroot for RabbitMQ 4 in {ROOT} (once; about a minute)")
    _run(["debootstrap", "--variant=minbase", "trixie", str(building)], 900)
    # no service may start inside the chroot while it is built (Debian's convention)
    policy = building / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    _run(["chroot", str(building), "apt-get", "update", "-qq"], 600)
    _run(
        [
            "chroot",
            str(building),
            "apt-get",
            "install",
            "-y",
            "-qq",
            "--no-install-recommends",
            "rabbitmq-server",
        ],
        900,
    )
    for vm in _chroot_pids(building):  # in case a package's script started one anyway
        os.kill(vm, signal.SIGKILL)
    building.rename(ROOT)
    log(f"chroot ready in {time.monotonic() - started:.0f}s")
    return time.monotonic() - started


def _mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)], check=False).returncode == 0


def _mount() -> None:
    for fs, target in (("proc", ROOT / "proc"), ("dev", ROOT / "dev")):
        target.mkdir(exist_ok=True)
        if not _mounted(target):
            cmd = ["mount", "-t", "proc", "proc"] if fs == "proc" else ["mount", "--bind", "/dev"]
            _run([*cmd, str(target)], 30)


def _chroot_pids(root: Path = ROOT) -> list[int]:
    """Processes whose root is the chroot: the node, and anything it left running."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "root")) == root:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _stop_own_epmd() -> None:
    """An epmd the node started inside the chroot (none ran on the host) outlives it and
    keeps /dev busy: end it once no node is registered with it."""
    epmds = [pid for pid in _chroot_pids() if _comm(pid) == "epmd"]
    if not epmds or _chroot_pids() != epmds:
        return
    names = run_captured(["chroot", str(ROOT), "epmd", "-names"], 10).stdout
    if "name " in names:
        return
    for pid in epmds:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _unmount() -> None:
    for target in (ROOT / "proc", ROOT / "dev"):
        if _mounted(target):
            _run(["umount", str(target)], 30)


def prepare_chroot() -> None:
    """What any node in the chroot needs (this module's node, or the 4.0 cluster of
    cluster.py): the chroot built, its open-files limit for the rabbitmq user, /proc
    and /dev mounted."""
    ensure_chroot()
    (ROOT / _LIMITS).parent.mkdir(parents=True, exist_ok=True)
    (ROOT / _LIMITS).write_text(_nofile_limits())
    _mount()


def chroot_pids() -> list[int]:
    """Every process running in the chroot (any node of it, its epmd, its CLI)."""
    return _chroot_pids()


def release_chroot() -> bool:
    """Once nothing runs in the chroot (an epmd of its own is ended), unmount /proc and
    /dev; True when it was left empty and unmounted, False while a node still runs."""
    _stop_own_epmd()
    if _chroot_pids():
        return False
    _unmount()
    return True


def _ctl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return run_captured(["chroot", str(ROOT), "rabbitmqctl", *args], timeout)


def start(timeout: float = 120.0) -> str:
    """Start the node unless it answers already; return its AMQP URL."""
    ensure_chroot()
    if tcp_open("127.0.0.1", AMQP_PORT) and amqp_ok(URL, timeout=3.0)[0]:
        return URL
    for relative, text in _CONFIG.items():
        (ROOT / relative).parent.mkdir(parents=True, exist_ok=True)
        (ROOT / relative).write_text(text)
    prepare_chroot()
    log(f"starting RabbitMQ 4 ({NODE}) in {ROOT} on 127.0.0.1:{AMQP_PORT}")
    _run(["chroot", str(ROOT), "rabbitmq-server", "-detached"], 60)
    if not wait_for(lambda: amqp_ok(URL, timeout=3.0)[0], timeout, interval=1.0):
        raise BrokerUnavailable(
            f"RabbitMQ 4 did not answer on :{AMQP_PORT} within {timeout:.0f}s; see "
            f"{ROOT}/var/log/rabbitmq/"
        )
    # the management API starts a moment after AMQP; the tests need it
    _ctl("await_startup", timeout=timeout)
    return URL


def stop() -> bool:
    """Stop the node (if running) and unmount; True when nothing of it is left running."""
    if (ROOT / _SERVER).exists() and tcp_open("127.0.0.1", AMQP_PORT):
        proc = _ctl("stop")
        if proc.returncode != 0:
            log(f"rabbitmqctl stop exited {proc.returncode}: {proc.stdout.strip()[-300:]}")
        wait_for(lambda: not tcp_open("127.0.0.1", AMQP_PORT), 60)

    # the port closes before the VM has exited: unmount only once nothing runs in there
    # (the 4.0 cluster of cluster.py runs in the same chroot: its VMs count as left)
    def gone() -> bool:
        _stop_own_epmd()
        return not _node_pids()

    stopped = wait_for(gone, 60)
    if not stopped:
        log(f"still running in {ROOT}: {_node_pids()}; left mounted")
    elif not release_chroot():
        log(f"other processes run in {ROOT} ({_chroot_pids()}): left mounted")
    return stopped


def _node_pids() -> list[int]:
    """This module's node: the chroot's processes whose environment does not name a node
    of its own (the cluster's VMs carry RABBITMQ_NODENAME)."""
    own = []
    for pid in _chroot_pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if not any(v.startswith(b"RABBITMQ_NODENAME=") for v in environ):
            own.append(pid)
    return own
