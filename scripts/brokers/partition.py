"""Cut one node of a local cluster off from its peers, and heal it: a network partition on
loopback, made with nftables (Debian's ``nftables``; the kernel has it built in).

Every node of :mod:`.cluster` listens on 127.0.0.1 and runs as the same user, so neither an
address nor a uid tells one node's packets from another's. What does:

* the node's own distribution port (``port + 20000``): every packet to or from it is
  dropped, which cuts the connections the peers opened to the node;
* the connections the node opened to its peers' distribution ports: found with ``ss`` by
  the node's pid, each dropped by its exact port pair, both ways;
* the connections it tries to open during the partition: the node's VM is moved into a
  cgroup (v2) of its own first, and nftables drops what a socket of that cgroup sends to a
  peer's distribution port (a socket keeps the cgroup it was made in, hence the port pairs
  above for the older ones).

Clients keep reaching the node's AMQP and management ports: a partition, not a crash, as
when a switch between the nodes fails. Packets are dropped, not refused, so the nodes learn
of it from their own failure detectors (Raft's within seconds; Erlang's net_ticktime of 60 s
for the distribution link), as they would on a real network.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from pathlib import Path

from .base import BrokerUnavailable, log

__all__ = ["TABLE", "heal", "is_partitioned", "partition"]

TABLE = "rmqdelay_partition"
"""The nftables table (family inet) holding every rule of this module; deleted on heal."""
_CGROUP_MOUNTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
_GROUP = "rmqdelay-partition"


def _cgroup2_root() -> tuple[Path, str]:
    """Where cgroup v2 is mounted, and its path as nftables names it (relative to
    /sys/fs/cgroup: ``unified/`` on a hybrid hierarchy)."""
    for root in _CGROUP_MOUNTS:
        if (root / "cgroup.procs").exists() and (root / "cgroup.subtree_control").exists():
            relative = root.relative_to("/sys/fs/cgroup").as_posix()
            return root, "" if relative == "." else f"{relative}/"
    raise BrokerUnavailable("no cgroup v2 hierarchy under /sys/fs/cgroup: cannot partition")


def _nft(script: str) -> None:
    proc = subprocess.run(
        ["nft", "-f", "-"], input=script, capture_output=True, text=True, timeout=30
    )
    if proc.returncode != 0:
        raise BrokerUnavailable(f"nft failed: {proc.stderr.strip()[-300:]}")


def _connections(pid: int, peer_ports: set[int]) -> list[tuple[int, int]]:
    """(local port, peer port) of the TCP connections ``pid`` holds to ``peer_ports``."""
    out = subprocess.run(
        ["ss", "-Htnp", "state", "established"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    found = []
    for line in out.splitlines():
        if f"pid={pid}," not in line:
            continue
        ends = re.findall(r"(?:\d+\.\d+\.\d+\.\d+|\[[^\]]*\]|\*):(\d+)", line)
        if len(ends) >= 2:
            local, peer = int(ends[0]), int(ends[1])
            if peer in peer_ports:
                found.append((local, peer))
    return found


def partition(pid: int, own_port: int, peer_ports: list[int]) -> list[tuple[int, int]]:
    """Cut the node whose VM is ``pid`` (distribution port ``own_port``) off from the peers'
    distribution ports; returns the existing connections it cut by port pair."""
    root, nft_root = _cgroup2_root()
    group = root / _GROUP
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(pid))  # new sockets of the node: this cgroup
    pairs = _connections(pid, set(peer_ports))
    peers = ", ".join(str(p) for p in peer_ports)
    rules = [
        f"tcp dport {own_port} drop",
        f"tcp sport {own_port} drop",
        f'socket cgroupv2 level 1 "{nft_root}{_GROUP}" tcp dport {{ {peers} }} drop',
    ]
    for local, peer in pairs:
        rules += [
            f"tcp sport {local} tcp dport {peer} drop",
            f"tcp sport {peer} tcp dport {local} drop",
        ]
    body = "\n".join(f"    {rule}" for rule in rules)
    # loopback packets cross output (the sender's socket) then input: output sees them all
    _nft(
        f"table inet {TABLE} {{\n  chain out {{\n"
        f"    type filter hook output priority 0; policy accept;\n{body}\n  }}\n}}\n"
    )
    log(f"partitioned the node on distribution port {own_port} ({len(pairs)} links cut)")
    return pairs


def is_partitioned() -> bool:
    proc = subprocess.run(
        ["nft", "list", "table", "inet", TABLE], capture_output=True, text=True, timeout=30
    )
    return proc.returncode == 0


def heal() -> None:
    """Drop every rule and put the node's VM back in the root cgroup."""
    if is_partitioned():
        _nft(f"delete table inet {TABLE}\n")
    root, _ = _cgroup2_root()
    group = root / _GROUP
    if group.exists():
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # exited meanwhile
                (root / "cgroup.procs").write_text(pid)
        group.rmdir()
    log("partition healed")
