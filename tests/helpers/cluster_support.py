"""The 3-node cluster for the tests in tests/cluster: fixtures ``cluster`` (and its old
name ``local_cluster``).

``make cluster-test`` starts the cluster (scripts/broker.py cluster start; RabbitMQ 4.3
unless ``CLUSTER_RABBITMQ=4`` or ``3``) and exports its nodes as
``RMQDELAY_CLUSTER_URLS`` and ``RMQDELAY_CLUSTER_MANAGEMENT_URLS`` (comma-separated, in
node order), and ``RMQDELAY_CLUSTER_RABBITMQ`` (43, 4 or 3: which of
scripts/brokers/cluster.py's clusters it is; without it, the one whose URLs those are);
without the URLs the fixture looks for ``make cluster``'s nodes. Killing and restarting
a node works on those local nodes only.
"""

from __future__ import annotations

import os
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest
from brokers import cluster as local_nodes
from brokers.probe import amqp_ok

from rmqdelay.amqp.management import ManagementApi
from tests.helpers.brokerctl import delete_prefixed

URLS_ENV = "RMQDELAY_CLUSTER_URLS"
MANAGEMENT_ENV = "RMQDELAY_CLUSTER_MANAGEMENT_URLS"


def _listed(variable: str, default: list[str]) -> list[str]:
    value = os.environ.get(variable, "").strip()
    return [item.strip() for item in value.split(",") if item.strip()] if value else default


@dataclass(frozen=True, repr=False)
class Cluster:
    """The nodes' URLs (index i is node i), where queue leaders are, and crash or
    restart a node."""

    urls: list[str]  # amqp:// with credentials: never print them unmasked
    management: list[str]

    def __repr__(self) -> str:  # pytest shows fixture values: keep passwords out
        return f"Cluster(management={self.management})"

    def api(self, path: str, node: int = 0) -> Any:
        """GET the management API of *node* (``path`` without the leading /api/)."""
        return ManagementApi(self.urls[node], self.management[node], timeout=10).get(path)

    def leader(self, queue: str, vhost: str = "/", node: int = 0) -> str:
        """The node that leads quorum queue *queue* (its host node for other types)."""
        path = f"queues/{urllib.parse.quote(vhost, safe='')}/{urllib.parse.quote(queue, safe='')}"
        row = self.api(path, node)
        return str(row.get("leader") or row["node"])

    def leaders(self, prefix: str, node: int = 0) -> Counter[str]:
        """How many of the prefix's quorum queues each node leads."""
        queues = self.api("queues?columns=name,type,leader,node", node)
        return Counter(
            str(q.get("leader") or q.get("node"))
            for q in queues
            if str(q["name"]).startswith(f"{prefix}.") and q.get("type") == "quorum"
        )

    def index_of(self, node_name: str) -> int:
        """The index of ``rmqd-c43-2@localhost`` (``rmqd-c2@localhost``...) in :attr:`urls`."""
        return local_nodes.node_names().index(node_name)

    def _local(self, index: int) -> int:
        if self.urls != local_nodes.urls():
            pytest.skip("killing or restarting a node needs the local cluster (make cluster)")
        return index

    def kill(self, index: int) -> None:
        """kill -9 node *index*'s Erlang VM, as a crash would; returns once its port closes."""
        local_nodes.kill(self._local(index))

    def restart(self, index: int) -> None:
        """Start node *index* again; returns once the cluster has every node running."""
        local_nodes.restart(self._local(index))

    def partition(self, index: int) -> None:
        """Cut node *index* off from the others (nftables); clients still reach it."""
        local_nodes.partition(self._local(index))

    def heal(self, index: int) -> None:
        """Undo :meth:`partition`; returns once the cluster is whole again."""
        local_nodes.heal(self._local(index))

    def stop_one(self, index: int) -> None:
        """rabbitmqctl stop node *index* (a clean shutdown)."""
        local_nodes.stop_one(self._local(index))

    def running_nodes(self, index: int = 0) -> int:
        """How many nodes node *index* sees running."""
        return local_nodes.running_nodes(self._local(index))


def _select_local_cluster() -> None:
    """Aim scripts/brokers/cluster.py at the local cluster the URLs name (3.10, 4.0, 4.3)
    when $RMQDELAY_CLUSTER_RABBITMQ does not say which."""
    wanted = _listed(URLS_ENV, [])
    if os.environ.get(local_nodes.VERSION_ENV, "").strip() or not wanted:
        return
    for version in local_nodes.FLAVOURS:
        local_nodes.select(version)
        if local_nodes.urls() == wanted:
            return
    local_nodes.select(local_nodes.DEFAULT)


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    """The cluster of ``make cluster-test``; skips (fails under CI) when it is not up."""
    _select_local_cluster()
    found = Cluster(
        urls=_listed(URLS_ENV, local_nodes.urls()),
        management=_listed(MANAGEMENT_ENV, local_nodes.management_urls()),
    )
    if len(found.urls) != len(found.management) or not all(
        amqp_ok(url, timeout=3.0)[0] for url in found.urls
    ):
        message = f"no cluster: run `make cluster-test` (or `make cluster`, or set {URLS_ENV})"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    _remove_leftovers(found)
    return found


def _remove_leftovers(found: Cluster) -> None:
    """Queues and exchanges of tests (``t-...``) that an interrupted run left on the local
    cluster: their leaders would weigh on where ``balanced`` puts new ones."""
    if found.urls != local_nodes.urls():
        return  # a cluster not ours: leave it alone
    removed = {}
    for kind in ("queue", "exchange"):
        rows = found.api(f"{kind}s?columns=name")
        names = [str(row["name"]) for row in rows if str(row["name"]).startswith("t-")]
        removed[kind] = delete_prefixed(found.urls[0], names, kind=kind) if names else 0
    if any(removed.values()):
        print(f"\nremoved what an earlier run left: {removed}")


@pytest.fixture(scope="session")
def local_cluster(cluster: Cluster) -> Cluster:
    """The same as ``cluster`` (its first name)."""
    return cluster
