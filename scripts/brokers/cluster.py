"""A local 3-node RabbitMQ cluster of Debian's ``rabbitmq-server``, on loopback only.

Three flavours, chosen by :func:`select` (``broker.py cluster --rabbitmq 4 ...``) or
``$RMQDELAY_CLUSTER_RABBITMQ`` (``43``, the default, ``4`` or ``3``):

* ``43``: RabbitMQ 4.3 (Debian sid, Erlang 29) in the chroot of :mod:`.chroot`'s
  ``rmq43`` (the one ``make test-rmq43`` runs). Nodes ``rmqd-c43-1@localhost`` ..
  ``rmqd-c43-3@localhost``: AMQP on 127.0.0.1:5721-5723, management on 15721-15723,
  distribution ports 25721-25723, data and logs under ``/var/lib/rmqdelay-cluster43``
  inside the chroot.
* ``4``: RabbitMQ 4.0 (Debian trixie, Erlang 27) in the chroot of ``rmq4``. Nodes
  ``rmqd-c4-1@localhost`` .. ``rmqd-c4-3@localhost``: AMQP on 127.0.0.1:5711-5713,
  management on 15711-15713, distribution ports 25711-25713, data and logs under
  ``/var/lib/rmqdelay-cluster4`` inside the chroot.
* ``3``: the host's RabbitMQ 3.10.8 (Debian bookworm). Its at-least-once dead-letter
  worker can strand messages when a queue's leader moves (a rolling restart left 31-62
  of 14-17k messages in ``messages_dlx`` in 3 runs of 4; fixed in 3.10.20). Nodes
  ``rmqd-c1@localhost`` .. ``rmqd-c3@localhost``: AMQP on 127.0.0.1:5701-5703,
  management on 15701-15703, distribution ports 25701-25703, data and logs under
  :data:`BASE`. They run as the ``rabbitmq`` user with its home, so they share its
  Erlang cookie (the host node's).

In a chroot the nodes run as the chroot's ``rabbitmq`` user, so they share its Erlang
cookie (the chroot's /var/lib/rabbitmq/.erlang.cookie); the host's epmd serves them. The
chroot's single node (``make test-rmq43``) may run beside them: stopping either leaves
the chroot mounted while the other runs.

Nodes 2 and 3 join node 1. The data is kept between runs, so a second start needs no
joining. For the cluster tests: ``make cluster-test`` (``CLUSTER_RABBITMQ=43|4|3``).
"""

from __future__ import annotations

import functools
import os
import re
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import chroot
from . import partition as _partition
from .base import BrokerUnavailable, log, run_captured
from .debian import DebianNode, start_node, stop_node
from .probe import amqp_ok, tcp_open, wait_for

__all__ = [
    "BASE",
    "DEFAULT",
    "FLAVOURS",
    "NAMES",
    "VERSION_ENV",
    "Flavour",
    "current",
    "heal",
    "kill",
    "management_urls",
    "node_names",
    "nodes",
    "partition",
    "pid",
    "registered",
    "restart",
    "running_nodes",
    "select",
    "start",
    "stop",
    "stop_one",
    "urls",
]

BASE = Path(os.environ.get("RMQDELAY_CLUSTER_DIR", "/var/tmp/rmqdelay-cluster"))
"""The 3.10 cluster's data (on the host)."""
NAMES = ("rmqd-c1", "rmqd-c2", "rmqd-c3")
"""The 3.10 cluster's node names (the selected flavour's: ``current().names``)."""
FIRST_PORT = 5701
MANAGEMENT_OFFSET = 10000  # 5701 -> 15701, as for every broker of this machine
VERSION_ENV = "RMQDELAY_CLUSTER_RABBITMQ"
CLUSTER_CONFIG = ("net_ticktime = 15",)
"""Nodes declare a silent peer down after 15 s, not 60: a 30 s partition then ends with
fresh distribution links instead of ones whose TCP retransmits backed off, and expired
messages move on through the tiers within seconds of the heal, not 40 s (README,
Running on a cluster)."""
DEFAULT = "43"  # the newest; 3.10.8's dead-letter worker loses messages in a rolling restart


@dataclass(frozen=True)
class Flavour:
    """Which RabbitMQ the cluster runs, and where."""

    version: str  # "3.10", "4.0" or "4.3", for messages
    names: tuple[str, ...]
    first_port: int
    base: Path  # the nodes' data; inside the chroot when there is one
    release: chroot.Release | None = None  # the chroot the nodes run in

    @property
    def root(self) -> Path | None:
        return None if self.release is None else self.release.root

    def host_path(self, path: Path) -> Path:
        root = self.root
        return path if root is None else root / path.relative_to("/")


FLAVOURS = {
    "3": Flavour("3.10", NAMES, FIRST_PORT, BASE),
    "4": Flavour(
        "4.0",
        ("rmqd-c4-1", "rmqd-c4-2", "rmqd-c4-3"),
        5711,
        Path("/var/lib/rmqdelay-cluster4"),
        release=chroot.RELEASES["rmq4"],
    ),
    "43": Flavour(
        "4.3",
        ("rmqd-c43-1", "rmqd-c43-2", "rmqd-c43-3"),
        5721,
        Path("/var/lib/rmqdelay-cluster43"),
        release=chroot.RELEASES["rmq43"],
    ),
}
_ALIASES = {"3": "3", "3.10": "3", "4": "4", "4.0": "4", "43": "43", "4.3": "43"}
_selected: list[str] = []


def select(version: str) -> Flavour:
    """Aim this module's functions at the cluster of RabbitMQ *version* (43 or 4.3, 4 or
    4.0, 3 or 3.10)."""
    try:
        key = _ALIASES[version.strip()]
    except KeyError:
        raise BrokerUnavailable(
            f"no cluster of RabbitMQ {version!r}: say 43 (4.3, sid chroot), 4 (4.0, trixie "
            "chroot) or 3 (3.10, the host's)"
        ) from None
    _selected[:] = [key]
    return FLAVOURS[key]


def current() -> Flavour:
    """The selected flavour: :func:`select`'s, else ``$RMQDELAY_CLUSTER_RABBITMQ``, else
    :data:`DEFAULT` (43)."""
    if not _selected:
        select(os.environ.get(VERSION_ENV, "").strip() or DEFAULT)
    return FLAVOURS[_selected[0]]


@functools.cache
def _nodes(flavour: Flavour) -> tuple[DebianNode, ...]:
    if flavour.release is not None:
        chroot.ensure_chroot(flavour.release)  # the node files go inside it
    return tuple(
        DebianNode.scratch(
            flavour.base,
            name,
            flavour.first_port + i,
            management_port=flavour.first_port + i + MANAGEMENT_OFFSET,
            root=flavour.root,
            config=CLUSTER_CONFIG,
        )
        for i, name in enumerate(flavour.names)
    )


def nodes() -> tuple[DebianNode, ...]:
    """The three nodes, their files written under the flavour's base on first use."""
    return _nodes(current())


def urls() -> list[str]:
    """The AMQP URLs, guest/guest included: never print them unmasked."""
    first = current().first_port
    return [f"amqp://guest:guest@127.0.0.1:{first + i}/%2F" for i in range(len(current().names))]


def management_urls() -> list[str]:
    first = current().first_port
    return [
        f"http://127.0.0.1:{first + i + MANAGEMENT_OFFSET}" for i in range(len(current().names))
    ]


def node_names() -> list[str]:
    return [f"{name}@localhost" for name in current().names]


def _ctl(node: DebianNode, *args: str, timeout: float = 120) -> str:
    proc = run_captured(node.command("rabbitmqctl", *args), timeout, node.environment())
    if proc.returncode != 0:
        raise BrokerUnavailable(
            f"rabbitmqctl {' '.join(args)} on {node.node_name} exited {proc.returncode}: "
            f"{proc.stdout.strip()[-300:]}"
        )
    return proc.stdout


def running_nodes(index: int = 0) -> int:
    """How many cluster nodes node *index* sees running (0 when it does not answer)."""
    try:
        out = _ctl(nodes()[index], "eval", "length(rabbit_nodes:all_running()).", timeout=30)
    except BrokerUnavailable:
        return 0
    return int(out.strip() or 0)


_PARTITIONS = (
    "code:ensure_loaded(rabbit_node_monitor), "
    "case erlang:function_exported(rabbit_node_monitor, partitions, 0) of "
    "true -> length(rabbit_node_monitor:partitions()); false -> 0 end."
)


def _partitions_on_record(index: int) -> int:
    """How many nodes node *index* holds a partition from (``rabbit_node_monitor``). 4.3
    keeps none: with Mnesia gone, so are its partition records and handling modes (its
    rabbit_node_monitor has no ``partitions/0``); 0 then."""
    return int(_ctl(nodes()[index], "eval", _PARTITIONS, timeout=60).strip() or 0)


def _up(node: DebianNode) -> bool:
    return tcp_open(node.host, node.port) and amqp_ok(node.url, timeout=3.0)[0]


def _start_together(to_start: list[DebianNode]) -> None:
    """Start the nodes at once: a clustered node waits at boot for the peer that stopped
    last, so one at a time could wait on a node not started yet."""
    errors: list[str] = []

    def one(node: DebianNode) -> None:
        try:
            start_node(node)
        except BrokerUnavailable as exc:
            errors.append(f"{node.node_name}: {exc}")

    threads = [threading.Thread(target=one, args=(node,)) for node in to_start]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise BrokerUnavailable("; ".join(errors))


def start() -> list[str]:
    """Start what is not running, join nodes 2 and 3 to node 1, wait for 3 running."""
    flavour = current()
    if flavour.release is not None:
        chroot.prepare_chroot(flavour.release)  # built, mounted, /etc/hosts, open files
    base = flavour.host_path(flavour.base)
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)  # the rabbitmq user must reach its node's directories
    all_nodes = nodes()
    first, *others = all_nodes
    if all(_up(n) for n in all_nodes) and running_nodes(0) == len(all_nodes):
        log(f"cluster of {len(all_nodes)} (RabbitMQ {flavour.version}) already running")
        return urls()
    started = time.monotonic()
    _start_together([n for n in all_nodes if not _up(n)])
    for index, node in enumerate(others, start=1):
        if running_nodes(index) == len(all_nodes):
            continue
        log(f"joining {node.node_name} to {first.node_name}")
        _ctl(node, "stop_app")
        _ctl(node, "reset")  # a fresh node joins with nothing of its own
        _ctl(node, "join_cluster", first.node_name or "")
        _ctl(node, "start_app")
    if not wait_for(lambda: running_nodes(0) == len(all_nodes), 120, interval=1.0):
        raise BrokerUnavailable(f"the cluster did not reach {len(all_nodes)} running nodes")
    log(
        f"cluster of {len(all_nodes)} (RabbitMQ {flavour.version}) up in "
        f"{time.monotonic() - started:.0f}s"
    )
    return urls()


def pid(node: DebianNode) -> int | None:
    """The node's Erlang VM: the beam.smp whose environment names the node (3.10 keeps
    the name out of the command line; in the chroot the environment passes through su)."""
    wanted = f"RABBITMQ_NODENAME={node.node_name}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            if b"beam.smp" not in cmdline or b"rabbitmqctl" in cmdline:
                continue  # the CLI's VM carries the node's environment too
            if wanted in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except OSError:
            continue
    return None


def registered() -> list[str]:
    """Which of the cluster's node names epmd still lists."""
    try:
        out = run_captured(["epmd", "-names"], 10).stdout
    except OSError:
        return []
    names = set(re.findall(r"^name (\S+) at port", out, re.MULTILINE))
    return [name for name in current().names if name in names]


def kill(index: int) -> None:
    """kill -9 one node's VM, as a crash would."""
    node = nodes()[index]
    vm = pid(node)
    if vm is not None:
        os.kill(vm, signal.SIGKILL)
    wait_for(lambda: not tcp_open(node.host, node.port), 30)


def restart(index: int) -> None:
    """Start one node again (after kill or stop) and wait for the cluster to be whole."""
    start_node(nodes()[index])
    names = current().names
    if not wait_for(lambda: running_nodes(index) == len(names), 120, interval=1.0):
        raise BrokerUnavailable(f"{names[index]} restarted but the cluster is not whole")


def partition(index: int) -> None:
    """Cut node *index* off from the other nodes (see :mod:`.partition`); clients still
    reach its AMQP and management ports."""
    all_nodes = nodes()
    vm = pid(all_nodes[index])
    if vm is None:
        raise BrokerUnavailable(f"{all_nodes[index].node_name} is not running: cannot cut it off")
    own = all_nodes[index].dist_port
    peers = [n.dist_port for i, n in enumerate(all_nodes) if i != index]
    assert own is not None and all(p is not None for p in peers)
    _partition.partition(vm, own, [p for p in peers if p is not None])


def heal(index: int | None = None) -> None:
    """Undo :func:`partition` (safe to call when there is none) and return once the
    cluster is whole again. Before 4.3, with the default ``cluster_partition_handling =
    ignore``, the nodes keep the partition on record once the network is back
    (``/api/nodes`` lists it, and node *index* counts as not running): as RabbitMQ's
    documentation prescribes, node *index*'s app is then restarted. 4.3 keeps no such
    record: its nodes find each other again on their own."""
    _partition.heal()
    if index is None:
        return
    node = nodes()[index]
    names = current().names
    if _partitions_on_record(0) or _partitions_on_record(index):
        log(f"{node.node_name} still partitioned on record: restarting its app")
        _ctl(node, "stop_app")
        _ctl(node, "start_app")

    def whole() -> bool:
        return running_nodes(0) == len(names) == running_nodes(index) and not _partitions_on_record(
            0
        )

    started = time.monotonic()
    if not wait_for(whole, 120, 1.0):
        raise BrokerUnavailable(f"{node.node_name} is back but the cluster is not whole")
    log(f"cluster whole again {time.monotonic() - started:.1f}s after the heal")


def stop_one(index: int) -> None:
    stop_node(nodes()[index])


def stop() -> bool:
    """Stop every node, node 1 last; True when no VM of theirs is left nor named by epmd.
    In the chroot, /proc and /dev are unmounted once nothing else runs there (the chroot's
    single node of :mod:`.chroot` may)."""
    flavour = current()
    if flavour.root is not None and not (flavour.root / "etc/passwd").exists():
        return True  # no chroot: nothing of this cluster can run
    for node in reversed(nodes()):
        if _up(node) or pid(node) is not None:
            stop_node(node)
    wait_for(lambda: all(pid(n) is None for n in nodes()), 20)  # VMs exit after the port
    for node in nodes():
        vm = pid(node)
        if vm is not None:  # did not stop in time: do not leave it behind
            log(f"{node.node_name} did not stop: kill -9 {vm}")
            os.kill(vm, signal.SIGKILL)
    gone = wait_for(lambda: all(pid(n) is None for n in nodes()) and not registered(), 30)
    if not gone:
        log(f"left behind: VMs {[pid(n) for n in nodes()]}, epmd names {registered()}")
    elif flavour.release is not None and not chroot.release_chroot(flavour.release):
        others = chroot.chroot_pids(flavour.release)
        log(f"{flavour.root} left mounted: other processes run there {others}")
    return gone
