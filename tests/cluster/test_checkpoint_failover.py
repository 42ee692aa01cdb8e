"""The node a checkpoint's writer is connected to is killed half-way through the
checkpoint (``kill -9`` of its Erlang VM): the readers, on the other nodes, go on from
the previous checkpoint, and nothing is lost (tests/helpers/checkpoints.py says what
must hold; tests/broker/test_checkpoints.py does the same with the writer's process
killed)."""

from __future__ import annotations

import time
import uuid

import pytest

from rmqdelay import Publisher, Settings, TopologyManager
from rmqdelay.core.journal.checkpoint import checkpoint_name
from rmqdelay.core.journal.records import journal_name
from tests.helpers.checkpoints import (
    DEST,
    check_after,
    cut_half_way,
    start_writer,
    watching,
    write_before,
)
from tests.helpers.cluster_support import Cluster

pytestmark = pytest.mark.cluster


def _settings(urls: list[str], prefix: str) -> Settings:
    return Settings(
        url=",".join(urls),
        prefix=prefix,
        max_delay="3h",
        connection_name=prefix,
        journal_bodies=True,
    )


def _led_elsewhere(cluster: Cluster, settings: Settings, dead: int, alive: int) -> None:
    """Wait until both streams have a leader on a live node (a stream whose leader died
    elects another among its replicas)."""
    deadline = time.monotonic() + 120
    for queue in (journal_name(settings.layout), checkpoint_name(settings.layout)):
        while True:
            try:
                leader = cluster.leader(queue, node=alive)
                if cluster.index_of(leader) != dead:
                    break
            except Exception:  # the API between two states: ask again
                pass
            assert time.monotonic() < deadline, f"{queue} has no live leader after 120 s"
            time.sleep(0.5)


def test_the_writers_node_killed_half_way_leaves_readers_on_the_previous_checkpoint(
    local_cluster: Cluster,
) -> None:
    prefix = f"t-ckpt-failover-{uuid.uuid4().hex[:6]}"
    dead, alive = 1, 0
    urls = local_cluster.urls
    others = [u for i, u in enumerate(urls) if i != dead]
    settings = _settings([*others, urls[dead]], prefix)  # the readers: on live nodes first
    on_dead = _settings([urls[dead], *others], prefix)  # the writer: on the node killed
    with TopologyManager(settings) as manager:
        manager.apply([DEST])
    try:
        before = write_before(settings, bulk_count=4000)
        with watching(settings) as marks:
            writer = start_writer(on_dead, marks)
            try:
                local_cluster.kill(dead)
                writer.wait(120)  # its connection gone, its appends fail
            finally:
                if writer.poll() is None:
                    writer.kill()
                    writer.wait(30)
        assert writer.returncode != 0, "the writer finished its checkpoint: make it bigger"
        _led_elsewhere(local_cluster, settings, dead, alive)
        cut_half_way(settings, before)
        with Publisher(settings) as publisher:  # a cancel on the nodes left
            assert publisher.cancel(before.ids[11])[0].outcome == "cancelled"
        check_after(settings, before)
    finally:
        local_cluster.restart(dead)
        with TopologyManager(_settings(urls, prefix)) as manager:
            manager.destroy([DEST], force=True)
