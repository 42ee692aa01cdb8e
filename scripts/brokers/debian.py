"""Start and stop Debian's ``rabbitmq-server``: the system node, or nodes of one's own.

A node of its own has its own node name, AMQP port, data and log directories, config
file and enabled-plugins file, so one machine can run several (a local cluster, or
another RabbitMQ version from a chroot, on their own ports)::

    node = DebianNode.scratch(Path("/var/tmp/rmq"), "rmq2", port=5682, management_port=15682)
    start_node(node)          # returns once it answers AMQP
    ...                       # node.url is amqp://guest:guest@127.0.0.1:5682/%2F
    stop_node(node)

``DebianNode()`` with no arguments is the system node: every field left ``None`` keeps
what the package's /etc/rabbitmq files say.

A node in a chroot (another Debian release's package) gives ``root``: its paths are then
the ones seen inside the chroot, its commands run through ``chroot root``, and its
directories are created under ``root`` and handed to the chroot's own rabbitmq user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .base import BrokerUnavailable, log, run_captured
from .probe import amqp_ok, tcp_open, wait_for

__all__ = [
    "DEBIAN_SERVER",
    "ENOUGH_OPEN_FILES",
    "START_TIMEOUT",
    "DebianNode",
    "can_install",
    "enable_plugins",
    "has_tool",
    "install_server",
    "is_root",
    "plugin_listed",
    "restart_node",
    "start_node",
    "stop_node",
    "system_node",
    "wait_until_up",
]

DEBIAN_SERVER = "/usr/sbin/rabbitmq-server"
START_TIMEOUT = 90.0  # seconds to wait for a freshly started node
DEFAULT_PORT = 5672
RUN_AS = "rabbitmq"  # the package's wrapper runs the server as this user when root starts it
OPEN_FILES = 65536
ENOUGH_OPEN_FILES = 8192
"""Fewer, and a suite's quorum queues can take every file handle RabbitMQ 3.10 allows:
each reserves some, and then new connections wait in the handshake (seen at 1024)."""
PACKAGE_ENV_FILE = Path("/etc/rabbitmq/rabbitmq-env.conf")
SYSTEM_ENV_FILE = Path("/var/tmp/rmqdelay-system-env.conf")
RAISE_OPEN_FILES = (
    f"ulimit -n {OPEN_FILES} 2>/dev/null || ulimit -n $(ulimit -Hn) 2>/dev/null || true\n"
)
"""The environment file's line that raises the node's open-files limit (the hard one at
most)."""


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def can_install() -> bool:
    """Could :func:`install_server` work here (root, with apt-get)?"""
    return is_root() and shutil.which("apt-get") is not None


@dataclass(frozen=True)
class DebianNode:
    """One rabbitmq-server node.  ``None`` fields keep the package's defaults."""

    port: int = DEFAULT_PORT  # where it listens (the config file decides; this is for probes)
    host: str = "127.0.0.1"
    node_name: str | None = None  # RABBITMQ_NODENAME, e.g. "rmq2@localhost"
    data_dir: Path | None = None  # RABBITMQ_MNESIA_BASE
    log_dir: Path | None = None  # RABBITMQ_LOG_BASE
    config_file: Path | None = None  # RABBITMQ_CONFIG_FILE (rabbitmq.conf syntax)
    enabled_plugins_file: Path | None = None  # RABBITMQ_ENABLED_PLUGINS_FILE
    env_file: Path | None = None  # RABBITMQ_CONF_ENV_FILE (instead of rabbitmq-env.conf)
    dist_port: int | None = None  # RABBITMQ_DIST_PORT (default: port + 20000)
    server: str | None = None  # the rabbitmq-server script (default DEBIAN_SERVER)
    command_prefix: tuple[str, ...] = ()  # e.g. ("chroot", "/srv/trixie")
    extra_env: tuple[tuple[str, str], ...] = ()  # more variables, e.g. RABBITMQ_SERVER_START_ARGS
    root: Path | None = None  # a chroot the paths above are inside of (see on_host)

    @classmethod
    def scratch(
        cls,
        base_dir: Path,
        name: str,
        port: int,
        *,
        management_port: int | None = None,
        plugins: Sequence[str] = (),
        config: Sequence[str] = (),
        host: str = "127.0.0.1",
        server: str | None = None,
        command_prefix: tuple[str, ...] = (),
        root: Path | None = None,
    ) -> DebianNode:
        """A node of its own under ``base_dir/name``, its files written now.

        ``config`` lines are appended to its rabbitmq.conf.  The rabbitmq user must be
        able to reach ``base_dir`` (pytest's tmp_path is private to root: use /var/tmp).
        With ``root`` (a chroot), ``base_dir`` is a path inside it and the commands run
        through ``chroot root`` unless ``command_prefix`` says otherwise.
        """
        home = Path(base_dir) / name
        if root is not None and not command_prefix:
            command_prefix = ("chroot", str(root))
        host_home = home if root is None else Path(root) / home.relative_to("/")
        for sub in ("data", "log"):
            (host_home / sub).mkdir(parents=True, exist_ok=True)
        lines = [f"listeners.tcp.1 = {host}:{port}"]
        enabled = list(plugins)
        if management_port is not None:
            enabled = ["rabbitmq_management", *(p for p in enabled if p != "rabbitmq_management")]
            lines += [f"management.tcp.ip = {host}", f"management.tcp.port = {management_port}"]
        (host_home / "rabbitmq.conf").write_text("\n".join([*lines, *config]) + "\n")
        (host_home / "enabled_plugins").write_text(f"[{','.join(enabled)}].\n")
        (host_home / "rabbitmq-env.conf").write_text(
            "# this node's settings are in the environment; the package's wrapper starts\n"
            "# it through su, whose pam_limits cuts open files to 1024, and at 1024 a few\n"
            "# hundred queues leave new connections hanging in the handshake\n" + RAISE_OPEN_FILES
        )
        return cls(
            port=port,
            node_name=f"{name}@localhost",
            data_dir=home / "data",
            log_dir=home / "log",
            config_file=home / "rabbitmq.conf",
            enabled_plugins_file=home / "enabled_plugins",
            env_file=home / "rabbitmq-env.conf",
            dist_port=port + 20000,  # derived from RABBITMQ_NODE_PORT only, not the config
            host=host,
            server=server,
            command_prefix=command_prefix,
            root=None if root is None else Path(root),
        )

    def on_host(self, path: Path) -> Path:
        """Where *path* (one of this node's paths) is seen from the host."""
        return path if self.root is None else self.root / path.relative_to("/")

    @property
    def url(self) -> str:
        """guest/guest: the default user, allowed from loopback only."""
        return f"amqp://guest:guest@{self.host}:{self.port}/%2F"

    @property
    def label(self) -> str:
        default = "the chroot's default node" if self.command_prefix else "the system node"
        return f"{self.node_name or default} on {self.host}:{self.port}"

    @property
    def plugins_file(self) -> Path:
        if self.enabled_plugins_file is not None:
            return self.enabled_plugins_file
        default = os.environ.get("RABBITMQ_ENABLED_PLUGINS_FILE", "/etc/rabbitmq/enabled_plugins")
        return Path(default)

    def environment(self) -> dict[str, str]:
        """The RABBITMQ_* variables that make the scripts act on this node."""
        pairs = {
            "RABBITMQ_NODENAME": self.node_name,
            "RABBITMQ_MNESIA_BASE": self.data_dir,
            "RABBITMQ_LOG_BASE": self.log_dir,
            "RABBITMQ_CONFIG_FILE": self.config_file,
            "RABBITMQ_ENABLED_PLUGINS_FILE": self.enabled_plugins_file,
            "RABBITMQ_CONF_ENV_FILE": self.env_file,
            "RABBITMQ_DIST_PORT": self.dist_port,
        }
        env = {key: str(value) for key, value in pairs.items() if value is not None}
        if self.log_dir is not None:  # not the cwd, /var/lib/rabbitmq
            env["ERL_CRASH_DUMP"] = str(self.log_dir / "erl_crash.dump")
        env.update(self.extra_env)
        return env

    def command(self, tool: str, *args: str) -> list[str]:
        """``tool`` (rabbitmqctl, rabbitmq-plugins, ...) beside the server, aimed at this node."""
        path = str(Path(self.server or DEBIAN_SERVER).with_name(tool))
        target = ["-n", self.node_name] if self.node_name and tool != "rabbitmq-server" else []
        return [*self.command_prefix, path, *target, *args]


def has_tool(node: DebianNode, tool: str) -> bool:
    """Is *tool* installed beside the node's server (assumed so inside a chroot)?"""
    return bool(node.command_prefix) or Path(node.command(tool)[-1]).exists()


def system_node(port: int = DEFAULT_PORT, host: str = "127.0.0.1") -> DebianNode:
    """The package's own node (rabbit@localhost, /var/lib/rabbitmq, /etc/rabbitmq), with
    :data:`SYSTEM_ENV_FILE` as its environment file: the package's, then a higher
    open-files limit, so that a node started here gets :data:`OPEN_FILES`."""
    with contextlib.suppress(OSError):
        text = (
            "# /etc/rabbitmq's environment file, then a higher open-files limit (written by\n"
            "# rmqdelay's scripts/brokers/debian.py): the package's wrapper starts the node\n"
            "# through su, whose pam_limits cut it to 1024, and at 1024 a few hundred quorum\n"
            "# queues leave new connections hanging in the handshake\n"
            f"[ -f {PACKAGE_ENV_FILE} ] && . {PACKAGE_ENV_FILE}\n" + RAISE_OPEN_FILES
        )
        if not SYSTEM_ENV_FILE.exists() or SYSTEM_ENV_FILE.read_text() != text:
            SYSTEM_ENV_FILE.write_text(text)
            SYSTEM_ENV_FILE.chmod(0o644)
        return DebianNode(port=port, host=host, server=DEBIAN_SERVER, env_file=SYSTEM_ENV_FILE)
    return DebianNode(port=port, host=host, server=DEBIAN_SERVER)


def restart_node(node: DebianNode) -> float:
    """Stop *node* and start it again (so that it reads its environment file anew); the
    seconds it took. Its durable queues survive; its connections are closed."""
    started = time.monotonic()
    if not stop_node(node):
        raise BrokerUnavailable(f"rabbitmqctl stop did not stop {node.label}")
    start_node(node)
    return time.monotonic() - started


def install_server() -> None:
    """apt-get install rabbitmq-server (root only); its postinst may start the node."""
    log("rabbitmq-server is missing: apt-get update && apt-get install -y rabbitmq-server")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "rabbitmq-server"]):
        proc = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=2, env=env, timeout=900, check=False
        )
        if proc.returncode != 0:
            raise BrokerUnavailable(f"{' '.join(cmd)} failed with exit code {proc.returncode}")


def _raise_nofile_limit(wanted: int = OPEN_FILES) -> None:
    """RabbitMQ sizes its file handle cache from the open-files limit: at the usual 1024
    a few hundred queues exhaust it and new connections hang in the handshake."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _chroot_user(root: Path, user: str) -> tuple[int, int] | None:
    """*user*'s uid and gid in the chroot's /etc/passwd (not the host's: they differ)."""
    try:
        lines = (root / "etc/passwd").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(":")
        if len(fields) > 3 and fields[0] == user:
            return int(fields[2]), int(fields[3])
    return None


def _prepare(node: DebianNode) -> None:
    """Create the node's directories; as root, hand them to the user the server runs as
    (in a chroot: the chroot's user of that name)."""
    dirs = [node.on_host(d) for d in (node.data_dir, node.log_dir) if d is not None]
    for directory in dirs:
        directory.mkdir(parents=True, exist_ok=True)
    if not (dirs and is_root()):
        return
    if node.root is not None:
        owner = _chroot_user(node.root, RUN_AS)
        if owner is not None:
            for directory in dirs:
                for path in (directory, *directory.rglob("*")):
                    os.chown(path, *owner)
        return
    if node.command_prefix:
        return
    try:
        pwd.getpwnam(RUN_AS)
    except KeyError:
        return
    for directory in dirs:
        for path in (directory, *directory.rglob("*")):
            shutil.chown(path, RUN_AS, RUN_AS)


def start_node(node: DebianNode, timeout: float | None = None) -> float:
    """Start *node* with ``rabbitmq-server -detached`` (launched in a session of its own)
    and wait until it answers AMQP.

    Returns the seconds it took; raises BrokerUnavailable saying what went wrong.
    """
    _prepare(node)
    _raise_nofile_limit()
    cmd = node.command("rabbitmq-server", "-detached")
    log(f"starting {' '.join(cmd)} ({node.label})")
    try:
        proc = run_captured(cmd, timeout=60, env=node.environment(), new_session=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokerUnavailable(f"rabbitmq-server -detached failed: {exc}") from None
    if proc.returncode != 0:
        raise BrokerUnavailable(
            f"rabbitmq-server -detached exited {proc.returncode}: {proc.stdout.strip()[-500:]}"
        )
    return wait_until_up(node, timeout)


def wait_until_up(node: DebianNode, timeout: float | None = None) -> float:
    """Wait until *node* answers AMQP; returns the seconds it took."""
    timeout = START_TIMEOUT if timeout is None else timeout
    log(f"waiting up to {timeout:.0f}s for {node.label} to answer AMQP")
    started = time.monotonic()
    last = ""

    def answers() -> bool:
        nonlocal last
        if not tcp_open(node.host, node.port):
            last = "port closed"
            return False
        ok, last = amqp_ok(node.url, timeout=3.0)
        return ok

    if not wait_for(answers, timeout, interval=1.0):
        logs = node.log_dir or "/var/log/rabbitmq"
        raise BrokerUnavailable(
            f"rabbitmq-server was started but did not answer within {timeout:.0f}s "
            f"({last}); see {logs}/"
        )
    return time.monotonic() - started


def stop_node(node: DebianNode, timeout: float = 60.0) -> bool:
    """``rabbitmqctl stop`` the node and wait for its port to close."""
    try:
        proc = run_captured(node.command("rabbitmqctl", "stop"), timeout, node.environment())
    except (OSError, subprocess.TimeoutExpired) as exc:
        log(f"rabbitmqctl stop failed: {exc}")
        return False
    if proc.returncode != 0:
        log(f"rabbitmqctl stop exited {proc.returncode}: {proc.stdout.strip()[-300:]}")
        return False
    return wait_for(lambda: not tcp_open(node.host, node.port), timeout)


def plugin_listed(node: DebianNode, plugin: str) -> bool:
    """Is *plugin* in the node's enabled-plugins file?"""
    try:
        text = node.plugins_file.read_text()
    except OSError:
        return False
    return re.search(rf"\b{re.escape(plugin)}\b", text) is not None


def enable_plugins(node: DebianNode, *plugins: str, timeout: float = 180.0) -> tuple[bool, str]:
    """``rabbitmq-plugins enable`` on the running node.  Returns (ok, detail)."""
    try:
        proc = run_captured(
            node.command("rabbitmq-plugins", "enable", *plugins), timeout, node.environment()
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"rabbitmq-plugins enable failed: {exc}"
    if proc.returncode != 0:
        tail = " | ".join(proc.stdout.strip().splitlines()[-3:])
        return False, f"rabbitmq-plugins enable exited {proc.returncode}: {tail}"
    return True, "enabled"
