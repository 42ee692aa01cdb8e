"""Selective purge on a broker: ``rmqdelay cancel`` by filter (the count first, asked
or ``--yes``, JSON), and a worker that never runs what a purge cancelled, retries too."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import subprocess
import time
from typing import Any

from rmqdelay import AsyncPublisher, Backoff, Context, Publisher, Worker
from tests.helpers.cli import CLI, run_cli, settings_env
from tests.helpers.worker_helpers import TestTopology, wait_until


def ids(publisher: Publisher, destination: str) -> list[str]:
    return sorted(r.message_id for r in publisher.list_scheduled(destination=destination))


def test_cancel_by_filter_counts_first_asks_and_cancels(shared_topology: TestTopology) -> None:
    orders, emails = shared_topology.dest("orders"), shared_topology.dest("emails")
    settings = shared_topology.settings([orders, emails])
    env = settings_env(settings)
    acme, other = {"tenant": "acme"}, {"tenant": "other"}
    with Publisher(settings) as publisher:
        for n in range(3):
            publisher.publish(orders, b"", delay=f"{n + 1}m", message_id=f"a{n}", headers=acme)
        publisher.publish(orders, b"", delay="5m", message_id="twice", headers=acme)
        publisher.publish(orders, b"", delay="9m", message_id="twice", headers=acme)
        publisher.publish(orders, b"", delay="2m", message_id="o1", headers=other)
        publisher.publish(
            orders, b"", delay="3m", message_id="cart", key=f"cart-{orders}", on_conflict="ignore"
        )
        publisher.publish(emails, b"", delay="1m", message_id="e1", headers=acme)
        before = ids(publisher, orders)
    # the copies then come from a checkpoint, as after a while in production (a purge
    # decodes only the lines its filters may select there)
    assert run_cli(env, "scheduled", "checkpoint").returncode == 0

    selected = ("cancel", "--destination", orders, "--header", "tenant=acme")
    dry = run_cli(env, *selected, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    counted = json.loads(dry.stdout)
    assert (counted["messages"], counted["copies"], counted["cancelled"]) == (4, 5, 0)
    assert counted["by_destination"] == {orders: 4} and counted["dry_run"]
    refused = run_cli(env, *selected)  # more than one, nobody at a terminal to answer
    assert refused.returncode == 1
    assert refused.stdout.startswith("not confirmed: cancelled none of 4 message(s) (5 copies")
    assert "add --yes" in refused.stderr
    with Publisher(settings) as publisher:
        assert ids(publisher, orders) == before

    answered = at_a_terminal(env, *selected, answer="y")
    assert answered.returncode == 0, answered.stderr
    assert "Cancel these 4 messages? [y/N]" in answered.stderr
    assert answered.stdout.startswith("cancelled 4 of 4 message(s) (5 copies, due ")
    keyed = run_cli(env, "cancel", "--key-prefix", f"cart-{orders}", "--json")  # one: no ask
    assert keyed.returncode == 0, keyed.stderr
    assert json.loads(keyed.stdout)["cancelled"] == 1
    with Publisher(settings) as publisher:
        assert ids(publisher, orders) == ["o1"]
        assert ids(publisher, emails) == ["e1"]  # another destination: untouched
        assert publisher.cancel("twice")[0].outcome == "cancelled"  # every copy had one
    later = run_cli(env, "cancel", "--due-after", "90s", "-d", emails, "--yes")
    assert later.returncode == 0 and later.stdout.startswith("cancelled 0 of 0 message(s)")


def at_a_terminal(env: dict[str, str], *args: str, answer: str) -> subprocess.CompletedProcess[str]:
    """``rmqdelay *args`` with a terminal for its stdin, answering its question."""
    main, side = pty.openpty()
    try:
        process = subprocess.Popen(
            [*CLI, *args],
            env=env,
            stdin=side,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.write(main, f"{answer}\n".encode())
        stdout, stderr = process.communicate(timeout=60)
    finally:
        os.close(side)
        os.close(main)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_filters_that_cannot_run_name_the_fix(shared_topology: TestTopology) -> None:
    env = settings_env(shared_topology.settings([]))
    for args, words in [
        (("cancel", "some-id", "--destination", "x"), "not both"),
        (("cancel", "--header", "tenant"), "KEY=VALUE"),
        (("cancel", "--dry-run"), "go with filters"),
        (("cancel",), "--key-prefix"),
        (("cancel", "--due-after", "soon"), "--due-after"),
    ]:
        got = run_cli(env, *args)
        assert got.returncode == 2, (args, got.stdout, got.stderr)
        assert words in got.stderr, (args, got.stderr)


async def test_a_purge_stops_a_message_in_its_retry_wait(shared_topology: TestTopology) -> None:
    """The worker's retry is a copy of its own in the journal: the purge selects and
    cancels it, and the handler is not called again."""
    dest = shared_topology.dest("retried")
    settings = shared_topology.settings([dest])
    app, attempts = Worker(settings), []

    @app.handler(dest, max_attempts=3, backoff=Backoff.schedule(["2s"]))
    async def handle(_body: Any, ctx: Context) -> None:
        attempts.append(ctx.attempt)
        raise ConnectionError("downstream unavailable")

    async with AsyncPublisher(settings) as publisher, app.running(concurrency=2):
        await publisher.publish(dest, b"{}", delay=0, headers={"batch": "7"})
        await wait_until(lambda: attempts == [1], 10, "the first attempt")
        deadline = time.monotonic() + 5
        while not (waiting := await publisher.list_scheduled(destination=dest)):
            assert time.monotonic() < deadline, "the retry was never scheduled"
            await asyncio.sleep(0.05)
        assert waiting[0].attempt == 2
        result = await publisher.cancel_matching(destination=dest, headers={"batch": "7"})
        assert (result.messages, result.cancelled) == (1, 1)
        await asyncio.sleep(max(0.0, waiting[0].due_at_ms / 1000 - time.time()) + 1.5)
    assert attempts == [1]


def test_the_dashboard_counts_first_and_cancels_no_more_than_it_counted(
    shared_topology: TestTopology,
) -> None:
    from starlette.testclient import TestClient

    from rmqdelay.dashboard.app import create_app

    dest = shared_topology.dest("dash")
    settings = shared_topology.settings([dest], dashboard_state=":memory:")
    acme = {"tenant": "acme"}
    with Publisher(settings) as publisher:
        for n in range(3):
            publisher.publish(dest, b"", delay=f"{n + 1}m", message_id=f"a{n}", headers=acme)
        publisher.publish(dest, b"", delay="1m", message_id="kept", headers={"tenant": "x"})
    with TestClient(create_app(settings)) as client:
        page = client.get("/scheduled")
        assert 'action="/cancel-matching"' in page.text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert token is not None
        asked = {"destination": dest, "headers": "tenant=acme", "due_before": "2h"}
        counted = client.post("/cancel-matching", data={"csrf_token": token[1], **asked})
        assert counted.status_code == 200, counted.text
        assert "would cancel 3 message(s)" in counted.text
        fields = dict(re.findall(r'type="hidden" name="([^"]+)" value="([^"]*)"', counted.text))
        assert fields["expected"] == "3" and fields["due_before"].endswith("+00:00")
        assert "Cancel these 3 messages" in counted.text
        with Publisher(settings) as publisher:  # one more matches before the confirmation
            publisher.publish(dest, b"", delay="5m", message_id="late", headers=acme)
        more = client.post("/cancel-matching", data=fields)
        assert more.status_code == 200 and "4 messages match now, more than the 3" in more.text
        api = client.post(
            "/api/cancel-matching",
            data={**asked, "expected": "4"},
            headers={"x-csrf-token": token[1]},
        )
        assert api.status_code == 200 and api.json()["cancelled"] == 4, api.text
        bad = client.post(
            "/api/cancel-matching", data={"headers": "tenant"}, headers={"x-csrf-token": token[1]}
        )
        assert bad.status_code == 400 and "KEY=VALUE" in bad.json()["text"]
    with Publisher(settings) as publisher:
        assert ids(publisher, dest) == ["kept"]
