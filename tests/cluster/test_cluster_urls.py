"""Every node's URL, in any order, and the management API of another node: the CLI works
end to end, whichever node each command reaches; another broker's API is refused.

RabbitMQ 4.0.5's nodes each report their own ``cluster_name`` (``rmqd-c4-1@vm``...)
when none is set, so the management API of node 2 must be accepted for an AMQP
connection to node 1 (``rmqdelay.amqp.management.same_cluster``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from broker import BrokerInfo

from tests.helpers.brokerctl import make_prefix
from tests.helpers.cli import rmqdelay_env, run_cli
from tests.helpers.cluster_support import Cluster
from tests.helpers.support import closed_port

pytestmark = pytest.mark.cluster

ORDERS = [(0, 1, 2), (1, 2, 0), (2, 0, 1)]


def ok(env: dict[str, str], *args: str) -> str:
    result = run_cli(env, *args, timeout=120)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    assert "error" not in result.stderr and "note" not in result.stderr, result.stderr
    return result.stdout


@pytest.fixture
def prefix(cluster: Cluster) -> Iterator[str]:
    """The test's own prefix on the cluster; its queues and exchanges are removed after."""
    value = make_prefix("cluster-urls")
    yield value
    env = rmqdelay_env(
        ",".join(cluster.urls), value, max_delay="1m", management_url=cluster.management[0]
    )
    run_cli(env, "topology", "destroy", "--yes", "--force", "-d", "jobs", timeout=120)


def _queues(cluster: Cluster, prefix: str) -> set[str]:
    return {
        str(q["name"])
        for q in cluster.api("queues?columns=name")
        if q["name"].startswith(f"{prefix}.")
    }


def test_every_command_with_all_urls_in_any_order_and_another_nodes_api(
    cluster: Cluster, prefix: str
) -> None:
    base = rmqdelay_env(prefix=prefix, max_delay="1m", extra={"COLUMNS": "250"})
    applied = False
    for order in ORDERS:
        first = order[0]  # ordered: each command connects to this node
        env = {**base, "RMQDELAY_URL": ",".join(cluster.urls[i] for i in order)}
        env["RMQDELAY_MANAGEMENT_URL"] = cluster.management[(first + 1) % 3]
        if not applied:
            assert "work queues: " in ok(env, "topology", "apply", "-d", "jobs")
            applied = True
        plan = ok(env, "topology", "plan", "-d", "jobs", "--show-ok")
        assert "unchecked" not in plan and "missing" not in plan and "binding" in plan
        assert "leader rmqd-" in plan  # the API's view: quorum leaders, per queue
        assert "is complete" in ok(env, "topology", "verify", "-d", "jobs")

        status = json.loads(ok(env, "status", "--json"))
        assert status["source"] == "management API", status
        assert [d["destination"] for d in status["destinations"]] == ["jobs"]
        assert status["missing"] == []

        message_id = f"m-{uuid.uuid4().hex[:8]}"
        said = ok(env, "publish", "jobs", "x", "--delay", "50s", "--message-id", message_id)
        assert said.startswith(f"{message_id} due ")
        listed = [json.loads(line) for line in ok(env, "scheduled", "list", "--json").split()]
        assert message_id in {row["message_id"] for row in listed}
        assert f"{message_id}: cancelled" in ok(env, "cancel", message_id)
        assert ok(env, "parked", "list", "--json").strip() == "[]"

    assert f"{prefix}.work.jobs" in _queues(cluster, prefix)
    # several management URLs: the first does not answer, the next does
    env = {**base, "RMQDELAY_URL": ",".join(cluster.urls)}
    env["RMQDELAY_MANAGEMENT_URL"] = f"http://127.0.0.1:{closed_port()},{cluster.management[2]}"
    assert "is complete" in ok(env, "topology", "verify", "-d", "jobs")
    destroyed = ok(env, "topology", "destroy", "--yes", "--force")  # finds -d jobs itself
    assert destroyed.startswith("deleted ")
    assert _queues(cluster, prefix) == set()


def test_another_brokers_api_is_refused(cluster: Cluster, broker: BrokerInfo) -> None:
    """The cluster's AMQP with the single test broker's API, and the other way round."""
    if not broker.management_url:
        pytest.skip("the test broker's management API is not available")
    base = rmqdelay_env(prefix=make_prefix("cluster-other"), max_delay="1m")
    pairs = [
        (",".join(cluster.urls), broker.management_url),
        (broker.url, cluster.management[1]),
    ]
    for url, management in pairs:
        env = {**base, "RMQDELAY_URL": url, "RMQDELAY_MANAGEMENT_URL": management}
        verify = run_cli(env, "topology", "verify", timeout=120)
        assert verify.returncode == 1
        line = " ".join(verify.stderr.split())
        assert f"the management API at {management} is another broker's" in line, line
        assert "binding" not in verify.stdout  # unchecked, not reported missing
        status = json.loads(ok(env, "status", "--json"))  # it falls back to AMQP
        assert status["source"] == "AMQP"
