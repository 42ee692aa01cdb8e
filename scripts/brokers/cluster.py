"""A local 3-node RabbitMQ cluster of Debian's ``rabbitmq-server``, on loopback only.

Nodes ``rmqd-c1@localhost`` .. ``rmqd-c3@localhost``: AMQP on 127.0.0.1:5701-5703,
management on 15701-15703, distribution ports 25701-25703, data and logs under
:data:`BASE`. They run as the ``rabbitmq`` user with its home, so they share its Erlang
cookie (the host node's); nodes 2 and 3 join node 1. The data is kept between runs, so
a second start needs no joining. For the cluster tests: ``make cluster-test``.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import threading
import time
from pathlib import Path

from .base import BrokerUnavailable, log, run_captured
from .debian import DebianNode, start_node, stop_node
from .probe import amqp_ok, tcp_open, wait_for

__all__ = [
    "BASE",
    "NAMES",
    "kill",
    "management_urls",
    "node_names",
    "nodes",
    "pid",
    "registered",
    "restart",
    "running_nodes",
    "start",
    "stop",
    "stop_one",
    "urls",
]

BASE = Path(os.environ.get("RMQDELAY_CLUSTER_DIR", "/var/tmp/rmqdelay-cluster"))
NAMES = ("rmqd-c1", "rmqd-c2", "rmqd-c3")
FIRST_PORT = 5701
MANAGEMENT_OFFSET = 10000  # 5701 -> 15701, as for every broker of this machine


@functools.cache
def nodes() -> tuple[DebianNode, ...]:
    """The three nodes, their files written under :data:`BASE` on first use."""
    return tuple(
        DebianNode.scratch(
            BASE, name, FIRST_PORT + i, management_port=FIRST_PORT + i + MANAGEMENT_OFFSET
        )
        for i, name in enumerate(NAMES)
    )


def urls() -> list[str]:
    """The AMQP URLs, guest/guest included: never print them unmasked."""
    return [node.url for node in nodes()]


def management_urls() -> list[str]:
    return [f"http://127.0.0.1:{FIRST_PORT + i + MANAGEMENT_OFFSET}" for i in range(len(NAMES))]


def node_names() -> list[str]:
    return [f"{name}@localhost" for name in NAMES]


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
    BASE.mkdir(parents=True, exist_ok=True)
    os.chmod(BASE, 0o755)  # the rabbitmq user must reach its node's directories
    all_nodes = nodes()
    first, *others = all_nodes
    if all(_up(n) for n in all_nodes) and running_nodes(0) == len(all_nodes):
        log(f"cluster of {len(all_nodes)} already running")
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
    log(f"cluster of {len(all_nodes)} up in {time.monotonic() - started:.0f}s")
    return urls()


def pid(node: DebianNode) -> int | None:
    """The node's Erlang VM: the beam.smp whose environment names the node (3.10 keeps
    the name out of the command line)."""
    wanted = f"RABBITMQ_NODENAME={node.node_name}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if b"beam.smp" not in (entry / "cmdline").read_bytes():
                continue
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
    return [name for name in NAMES if name in names]


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
    if not wait_for(lambda: running_nodes(index) == len(NAMES), 120, interval=1.0):
        raise BrokerUnavailable(f"{NAMES[index]} restarted but the cluster is not whole")


def stop_one(index: int) -> None:
    stop_node(nodes()[index])


def stop() -> bool:
    """Stop every node, node 1 last; True when no VM of theirs is left nor named by epmd."""
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
    return gone
