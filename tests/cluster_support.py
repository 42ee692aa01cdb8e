"""The local 3-node cluster (``make cluster``) for the tests in tests/cluster."""

from __future__ import annotations

import base64
import json
import os
import urllib.request
from collections import Counter
from typing import Any

import pytest
from brokers import cluster
from brokers.probe import amqp_ok


class Cluster:
    """URLs of the three nodes, where queue leaders are, and crash or restart a node."""

    urls = cluster.urls()
    management = cluster.management_urls()

    def api(self, path: str, node: int = 0) -> Any:
        auth = base64.b64encode(b"guest:guest").decode()
        request = urllib.request.Request(
            f"{self.management[node]}/api/{path}", headers={"Authorization": f"Basic {auth}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.load(response)

    def leaders(self, prefix: str, node: int = 0) -> Counter[str]:
        """How many of the prefix's quorum queues each node leads."""
        queues = self.api("queues?columns=name,type,leader,node", node)
        return Counter(
            str(q.get("leader") or q.get("node"))
            for q in queues
            if str(q["name"]).startswith(f"{prefix}.") and q.get("type") == "quorum"
        )

    def index_of(self, node_name: str) -> int:
        return [f"{n}@localhost" for n in cluster.NAMES].index(node_name)

    kill = staticmethod(cluster.kill)
    restart = staticmethod(cluster.restart)
    stop_one = staticmethod(cluster.stop_one)


@pytest.fixture(scope="session")
def local_cluster() -> Cluster:
    if not all(amqp_ok(url, timeout=3.0)[0] for url in cluster.urls()):
        message = "no local cluster: run `make cluster` (or `make cluster-test`)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return Cluster()
