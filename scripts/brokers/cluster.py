"""A local 3-node RabbitMQ cluster of Debian's ``rabbitmq-server``, on loopback only.

Nodes ``rmqd-c1@localhost`` .. ``rmqd-c3@localhost``: AMQP on 127.0.0.1:5701-5703,
management on 15701-15703, distribution ports 25701-25703, data and logs under
:data:`BASE`. They run as the ``rabbitmq`` user with its home, so they share its Erlang
cookie; nodes 2 and 3 join node 1. For the cluster tests: ``make cluster-test``.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from .base import BrokerUnavailable, log, run_captured
from .debian import DebianNode, start_node, stop_node
from .probe import amqp_ok, tcp_open, wait_for

__all__ = ["BASE", "NAMES", "kill", "management_urls", "nodes", "start", "stop", "urls"]

BASE = Path(os.environ.get("RMQDELAY_CLUSTER_DIR", "/var/tmp/rmqdelay-cluster"))
NAMES = ("rmqd-c1", "rmqd-c2", "rmqd-c3")
FIRST_PORT = 5701


def nodes() -> list[DebianNode]:
    return [
        DebianNode.scratch(BASE, name, FIRST_PORT + i, management_port=15701 + i)
        for i, name in enumerate(NAMES)
    ]


def urls() -> list[str]:
    return [node.url for node in nodes()]


def management_urls() -> list[str]:
    return [f"http://127.0.0.1:{15701 + i}" for i in range(len(NAMES))]


def _ctl(node: DebianNode, *args: str, timeout: float = 120) -> str:
    proc = run_captured(node.command("rabbitmqctl", *args), timeout, node.environment())
    if proc.returncode != 0:
        raise BrokerUnavailable(
            f"rabbitmqctl {' '.join(args)} on {node.node_name} exited {proc.returncode}: "
            f"{proc.stdout.strip()[-300:]}"
        )
    return proc.stdout


def _running_nodes(node: DebianNode) -> int:
    try:
        out = _ctl(node, "eval", "length(rabbit_nodes:all_running()).", timeout=30)
    except BrokerUnavailable:
        return 0
    return int(out.strip() or 0)


def _up(node: DebianNode) -> bool:
    return tcp_open(node.host, node.port) and amqp_ok(node.url, timeout=3.0)[0]


def start() -> list[str]:
    """Start what is not running, join nodes 2 and 3 to node 1, wait for 3 running."""
    BASE.mkdir(parents=True, exist_ok=True)
    os.chmod(BASE, 0o755)
    all_nodes = nodes()
    first, *others = all_nodes
    if all(_up(n) for n in all_nodes) and _running_nodes(first) == len(all_nodes):
        return urls()
    started = time.monotonic()
    for node in all_nodes:
        if not _up(node):
            start_node(node)
    for node in others:
        if _running_nodes(node) == len(all_nodes):
            continue
        _ctl(node, "stop_app")
        _ctl(node, "reset")  # a fresh node joins with nothing of its own
        _ctl(node, "join_cluster", first.node_name or "")
        _ctl(node, "start_app")
    if not wait_for(lambda: _running_nodes(first) == len(all_nodes), 120, interval=1.0):
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


def kill(index: int) -> None:
    """kill -9 one node's VM, as a crash would."""
    node = nodes()[index]
    vm = pid(node)
    if vm is not None:
        os.kill(vm, signal.SIGKILL)
    wait_for(lambda: not tcp_open(node.host, node.port), 30)


def restart(index: int) -> None:
    """Start one node again (after kill or stop) and wait for the cluster to be whole."""
    all_nodes = nodes()
    start_node(all_nodes[index])
    wait_for(lambda: _running_nodes(all_nodes[index]) == len(all_nodes), 120, interval=1.0)


def stop_one(index: int) -> None:
    stop_node(nodes()[index])


def stop() -> bool:
    """Stop every node; True when none of their VMs is left."""
    for node in reversed(nodes()):
        if _up(node) or pid(node) is not None:
            stop_node(node)
    for node in nodes():
        vm = pid(node)
        if vm is not None:  # did not stop in time: do not leave it behind
            os.kill(vm, signal.SIGKILL)
    gone = wait_for(lambda: all(pid(n) is None for n in nodes()), 30)
    if gone:
        # a node of a stopped cluster waits for its peers when started alone; the next
        # start forms a fresh cluster instead (this cluster is for tests)
        shutil.rmtree(BASE, ignore_errors=True)
    return gone
