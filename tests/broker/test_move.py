"""``rmqdelay move``: 10,000 waiting messages moved from the suite's RabbitMQ 3.10 to the
4.3 node CI runs beside it, the mover killed (``SIGKILL``) half-way and run again; a
worker on 4.3 then gets every message that should go once in effect, none early, with
its id, body, headers, attempt and key; cancelled ones stay behind. A recurring
schedule's occurrence, due before the move, arrives there at once with its chain, and
the worker there publishes the next one.

The 4.3 node is ``RMQDELAY_MOVE_TO_URL``, else ``scripts/broker.py rmq43``'s on :5683,
checked to be a 4.x broker (another may listen there). CI starts it beside ``make
test``: with ``CI`` set, the test waits for it, and fails without it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from rmqdelay import Context, Publisher, Settings, TopologyManager, Worker
from rmqdelay.core.clock import datetime_of_ms, now_ms
from tests.helpers.brokerctl import server_version
from tests.helpers.cli import CLI, rmqdelay_env
from tests.helpers.worker_helpers import make_settings

COUNT = 10_000
NODE_43 = "amqp://guest:guest@127.0.0.1:5683/%2F"
WAIT_FOR_NODE_S = 300


def _answers(url: str) -> str | None:
    try:
        return server_version(url)
    except Exception:
        return None


@pytest.fixture
def new_cluster(amqp_url: str, prefix: str) -> Iterator[str]:
    """The 4.3 node's URL; its objects of this test's prefix are deleted after."""
    if server_version(amqp_url).startswith("4."):
        pytest.skip("the move test runs in the 3.10 suite, from 3.10 to the 4.3 node")
    url = os.environ.get("RMQDELAY_MOVE_TO_URL", NODE_43)
    deadline = time.monotonic() + (WAIT_FOR_NODE_S if os.environ.get("CI") else 0)
    while not (version := _answers(url)) and time.monotonic() < deadline:
        time.sleep(5)
    if not version:
        if os.environ.get("CI"):
            pytest.fail(f"no RabbitMQ 4.3 answered at {NODE_43} (CI starts it beside make test)")
        pytest.skip("no RabbitMQ 4.3 node (scripts/broker.py rmq43 start)")
    assert version.startswith("4."), f"{url} is RabbitMQ {version}, not the 4.3 node"
    yield url
    with TopologyManager(Settings(url=url, prefix=prefix, max_delay="1h")) as manager:
        manager.destroy(["moved"], force=True)  # its work queue: the API here is not 4.3's


def waiting(settings: Settings, destination: str) -> int:
    """Messages ready in the old cluster's tiers and the destination's work queue (the
    mover's unacked ones are not): what the mover takes. The tiers alone would drop as
    messages fall due, with no move at all (on a slow machine, before the first run)."""
    queues = [t.queue for t in settings.layout.tiers] + [settings.layout.work_queue(destination)]
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        return sum(channel.queue_declare(q, passive=True).method.message_count for q in queues)
    finally:
        connection.close()


@pytest.mark.timeout(WAIT_FOR_NODE_S + 180)  # the wait for the node, and the move
def test_a_move_killed_half_way_and_run_again_delivers_each_once_and_never_early(
    amqp_url: str, prefix: str, new_cluster: str
) -> None:
    dest = "moved"
    old = make_settings(amqp_url, prefix, [dest])
    rng = random.Random(7)
    sent: dict[str, tuple[int, dict[str, Any]]] = {}
    with Publisher(old) as publisher:
        requests: list[dict[str, Any]] = []
        for n in range(COUNT):
            request: dict[str, Any] = {
                "destination": dest,
                "body": f"m{n}".encode(),
                "delay": f"{rng.randint(20_000, 28_000)}ms",  # past a slow publish_many
                "message_id": f"m{n}",
                "headers": {"n": n, "rmqdelay-attempt": 3 if n % 100 == 7 else 1},
            }
            if n % 50 == 3:
                request |= {"key": f"k{n}", "on_conflict": "ignore"}
            requests.append(request)
        for result, request in zip(publisher.publish_many(requests), requests, strict=True):
            sent[result.message_id] = (result.due_at_ms, request)
        gone = [f"m{n}" for n in range(0, COUNT, 200)]  # cancelled: they stay behind
        assert {r.outcome for r in publisher.cancel(*gone)} == {"cancelled"}
        # an hourly schedule whose occurrence falls due before the move: no worker takes
        # it here, so it waits in the work queue, and moves already due
        first_ms = now_ms() + 1_000
        added = publisher.add_recurring(
            "hourly", dest, b"report", every="1h", first_at=datetime_of_ms(first_ms)
        )
        [schedule] = publisher.list_recurring()
    occurrence_id = added.message_id
    assert occurrence_id is not None
    while now_ms() < first_ms + 1_000:  # a clock condition: the occurrence is due here
        time.sleep(0.1)
    new = Settings(url=new_cluster, prefix=prefix, max_delay="1h")
    with TopologyManager(new) as manager:  # the guide's first step: the new topology
        manager.apply([dest])
    env = rmqdelay_env(amqp_url, prefix, max_delay="1h")
    command = [*CLI, "move", "--to", new_cluster, "--json"]
    dry = subprocess.run([*command, "--dry-run"], env=env, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert json.loads(dry.stdout)["waiting"] == COUNT + 1  # and the schedule's occurrence

    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    while first.poll() is None and waiting(old, dest) > COUNT // 2:
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)  # half-way: some published there, not acked here
    first.communicate(timeout=30)
    assert first.returncode == -signal.SIGKILL, "the first run ended before it was killed"
    assert 0 < waiting(old, dest) < COUNT

    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    report = json.loads(again.stdout)
    assert set(report["skipped"]) <= {"cancelled"}  # the rest: the first run's (killed)
    assert report["moved"] + report["already_there"] < COUNT - len(gone)  # run 1 moved some
    print("second run:", report)
    assert waiting(old, dest) == 0

    expected = set(sent) - set(gone) | {occurrence_id}
    calls = asyncio.run(_handled(new, dest, expected, max(d for d, _ in sent.values())))
    ids = [c[0] for c in calls]
    assert set(ids) == expected  # every one that should go, arrived; no cancelled one
    with Publisher(new) as publisher:  # the schedule went with its occurrence, chain and all
        [carried] = publisher.list_recurring()
    assert (carried.name, carried.destination, carried.rule) == ("hourly", dest, schedule.rule)
    assert carried.chain == schedule.chain
    # the worker there handled the occurrence and published the next one, an hour on
    assert carried.next_occurrence(now_ms()) == first_ms + 3_600_000
    duplicates = len(ids) - len(set(ids))
    # a copy published there but not yet journaled when the first run was killed goes
    # twice (at least once): at most one batch of them
    assert duplicates <= 500, duplicates
    for message_id, due_ms, at_ms, attempt, headers, body in calls:
        if message_id == occurrence_id:  # due before the move: sent at once there
            assert at_ms >= first_ms and body == b"report"
            continue
        original_due, request = sent[message_id]
        # never early; its due time there is its own (or, moved once due, the move's)
        assert at_ms >= original_due and due_ms >= original_due, message_id
        assert attempt == request["headers"]["rmqdelay-attempt"]
        assert headers["n"] == request["headers"]["n"] and body == request["body"]
        assert headers.get("rmqdelay-key") == request.get("key")


async def _handled(
    settings: Settings, dest: str, expected: set[str], last_due_ms: int
) -> list[tuple[str, int, int, int, dict[str, Any], bytes]]:
    """Every handling on the new cluster until each expected id came, and 2 s after the
    last due time (for late duplicates)."""
    app = Worker(settings)
    calls: list[tuple[str, int, int, int, dict[str, Any], bytes]] = []

    @app.handler(dest)
    async def handle(body: bytes, ctx: Context) -> None:
        due = ctx.due_at
        assert due is not None
        headers = dict(ctx.headers)
        at = int(time.time() * 1000)
        calls.append(
            (ctx.message_id, round(due.timestamp() * 1000), at, ctx.attempt, headers, body)
        )

    async with app.running(concurrency=32):
        deadline = time.monotonic() + 120
        while {c[0] for c in calls} < expected or time.time() * 1000 < last_due_ms + 2000:
            assert time.monotonic() < deadline, f"{len({c[0] for c in calls})} arrived"
            await asyncio.sleep(0.2)
    return calls
