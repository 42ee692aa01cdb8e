"""Keyed publishes on a broker: the answer comes from reading the journal back.

The publisher keeps its journal consumer between keyed publishes (a second reads only
what is new); these check the answers (scheduled, ignored, replaced), that they agree
across publishers, and that a lost reader is reopened where it stopped.
"""

from __future__ import annotations

import asyncio
import time

import pika
import pytest

from rmqdelay import AsyncPublisher, ConfigurationError, InvalidMessageError, Publisher
from rmqdelay.core.journal.flows import read
from rmqdelay.core.messages import KEY
from tests.helpers.cli import run_cli, settings_env
from tests.helpers.worker_helpers import TestTopology


def _key(topology: TestTopology, name: str) -> str:
    return f"{topology.prefix}-{name}"


def test_sync_keyed_publishes_answer_from_the_journal(shared_topology: TestTopology) -> None:
    dest = shared_topology.dest("keyed")
    settings = shared_topology.settings([dest])
    key = _key(shared_topology, "order-42")
    with Publisher(settings) as publisher:
        first = publisher.publish(dest, {"n": 1}, delay="1m", key=key, on_conflict="ignore")
        assert (first.outcome, first.generation, first.key) == ("scheduled", 1, key)
        second = publisher.publish(dest, {"n": 2}, delay="2m", key=key, on_conflict="ignore")
        assert second.outcome == "ignored"
        assert (second.message_id, second.due_at_ms) == (first.message_id, first.due_at_ms)
        assert second.ignored_id not in (None, first.message_id)
        third = publisher.publish(dest, {"n": 3}, delay="3m", key=key, on_conflict="replace")
        assert (third.outcome, third.generation, third.replaced_id) == (
            "replaced",
            2,
            first.message_id,
        )
        plain = publisher.publish(dest, {"n": 4}, delay="1m")
        assert (plain.outcome, plain.key, plain.generation) == ("scheduled", None, None)
        # a second publisher, with a fold of its own, agrees
        with Publisher(settings) as other:
            fourth = other.publish(dest, {"n": 5}, delay="1m", key=key, on_conflict="ignore")
        assert (fourth.outcome, fourth.message_id) == ("ignored", third.message_id)
        # the first publisher's follower reads on from where it stopped
        follower = publisher.core.key_follower()
        before = follower.next_offset
        fifth = publisher.publish(dest, {"n": 6}, delay="1m", key=key, on_conflict="ignore")
        assert fifth.outcome == "ignored"
        assert follower.next_offset is not None and before is not None
        assert follower.next_offset > before


def test_the_key_travels_in_a_header(shared_topology: TestTopology) -> None:
    dest = shared_topology.dest("keyhdr")
    settings = shared_topology.settings([dest])
    key = _key(shared_topology, "hdr")
    with Publisher(settings) as publisher:
        result = publisher.publish(dest, b"x", delay=0, key=key, on_conflict="replace")
        records = publisher._run(read(settings.layout))
    mine = [r for r in records if r.message_id == result.message_id]
    assert [(r.kind, r.key, r.on_conflict) for r in mine] == [("scheduled", key, "replace")]
    assert KEY not in mine[0].headers  # the record holds it in its own field


def test_publish_many_answers_each_keyed_request(shared_topology: TestTopology) -> None:
    dest = shared_topology.dest("keymany")
    settings = shared_topology.settings([dest])
    keys = [_key(shared_topology, f"k{i}") for i in range(3)]
    requests = [
        {"destination": dest, "body": b"a", "delay": "1m", "key": k, "on_conflict": "ignore"}
        for k in keys * 2
    ] + [{"destination": dest, "body": b"plain", "delay": "1m"}]
    with Publisher(settings) as publisher:
        results = publisher.publish_many(requests)
    assert [r.outcome for r in results] == ["scheduled"] * 3 + ["ignored"] * 3 + ["scheduled"]
    assert [r.message_id for r in results[3:6]] == [r.message_id for r in results[:3]]


def test_a_lost_reader_reads_on_from_its_offset(shared_topology: TestTopology) -> None:
    dest = shared_topology.dest("keylost")
    settings = shared_topology.settings([dest])
    key = _key(shared_topology, "lost")
    with Publisher(settings) as publisher:
        first = publisher.publish(dest, b"1", delay="1m", key=key, on_conflict="ignore")
        follower = (publisher._followers or {}).get("keys")
        assert follower is not None and follower._connection is not None
        follower._connection.close()  # as a missed heartbeat would
        second = publisher.publish(dest, b"2", delay="1m", key=key, on_conflict="ignore")
    assert (second.outcome, second.message_id) == ("ignored", first.message_id)


def test_keys_need_the_journal_and_a_choice(shared_topology: TestTopology) -> None:
    dest = shared_topology.dest("keyerr")
    off = shared_topology.settings([dest]).replace(schedule_journal=False)
    with Publisher(off) as publisher, pytest.raises(ConfigurationError, match="schedule journal"):
        publisher.publish(dest, b"x", delay="1m", key="k", on_conflict="ignore")
    with (
        Publisher(shared_topology.settings([dest])) as publisher,
        pytest.raises(InvalidMessageError, match=r'"ignore".*"replace"'),
    ):
        publisher.publish(dest, b"x", delay="1m", key="k")


def test_async_concurrent_keyed_publishes_agree(shared_topology: TestTopology) -> None:
    dest = shared_topology.dest("keyasync")
    settings = shared_topology.settings([dest])
    key = _key(shared_topology, "async")

    async def main() -> list[str]:
        async with AsyncPublisher(settings) as publisher:
            results = await asyncio.gather(
                *(
                    publisher.publish(dest, {"n": i}, delay="1m", key=key, on_conflict="ignore")
                    for i in range(20)
                )
            )
        winners = {r.message_id for r in results}
        assert len(winners) == 1
        return [r.outcome for r in results]

    outcomes = asyncio.run(main())
    assert sorted(outcomes) == ["ignored"] * 19 + ["scheduled"]


def test_reschedule_earlier_sends_a_fresh_copy_later_only_a_record(
    shared_topology: TestTopology,
) -> None:
    dest = shared_topology.dest("resched")
    settings = shared_topology.settings([dest]).replace(journal_bodies=True)
    key = _key(shared_topology, "resched")
    with Publisher(settings) as publisher:
        first = publisher.publish(dest, b"body", delay="10m", key=key, on_conflict="ignore")
        later = publisher.reschedule(key, delay="20m")
        assert (later.outcome, later.fresh_copy, later.message_id) == (
            "rescheduled",
            False,
            first.message_id,
        )
        earlier = publisher.reschedule(first.message_id, delay="1s")
        assert (earlier.outcome, earlier.fresh_copy) == ("rescheduled", True)
        assert earlier.due_at_ms is not None
        rows = publisher.list_scheduled(key=key)
        assert [(r.message_id, r.due_at_ms) for r in rows] == [
            (first.message_id, earlier.due_at_ms)
        ]
        gone = publisher.cancel(keys=[key])
        assert (gone[0].key, gone[0].message_id, gone[0].outcome) == (
            key,
            first.message_id,
            "cancelled",
        )
        assert publisher.reschedule(key, delay="1h").outcome == "cancelled"
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        deadline = time.monotonic() + 15
        got = None
        while got is None and time.monotonic() < deadline:
            method, properties, body = channel.basic_get(settings.layout.work_queue(dest))
            if method is not None:
                assert properties is not None and properties.headers is not None
                got = (properties.message_id, properties.headers[KEY], body)
                channel.basic_ack(method.delivery_tag or 0)
            else:
                time.sleep(0.2)
        # the fresh copy arrives at the new time (the old ones wait in their tiers)
        assert got == (first.message_id, key, b"body")
    finally:
        connection.close()


def test_async_a_lost_follower_channel_reads_on(shared_topology: TestTopology) -> None:
    dest = shared_topology.dest("keyalost")
    settings = shared_topology.settings([dest])
    key = _key(shared_topology, "alost")

    async def main() -> None:
        async with AsyncPublisher(settings) as publisher:
            first = await publisher.publish(dest, b"1", delay="1m", key=key, on_conflict="ignore")
            follower = (publisher._followers or {}).get("keys")
            assert follower is not None and follower.channel is not None
            await follower.channel.close()  # as a channel error would
            second = await publisher.publish(dest, b"2", delay="1m", key=key, on_conflict="ignore")
            assert (second.outcome, second.message_id) == ("ignored", first.message_id)
            # a key cancelled is free again, from the same publisher's fold
            await publisher.cancel(keys=[key])
            third = await publisher.publish(dest, b"3", delay="1m", key=key, on_conflict="ignore")
            assert (third.outcome, third.generation) == ("scheduled", 2)

    asyncio.run(main())


def test_cli_publish_with_a_key(shared_topology: TestTopology) -> None:
    dest = shared_topology.dest("keycli")
    env = settings_env(shared_topology.settings([dest]))
    key = _key(shared_topology, "cli")
    args = ["publish", dest, "hi", "--delay", "10m", "--key", key, "--on-conflict", "ignore"]
    first = run_cli(env, *args)
    second = run_cli(env, *args)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert f"key {key} generation 1 scheduled" in first.stdout
    assert f"key {key} generation 1 ignored" in second.stdout
    assert second.stdout.split()[0] == first.stdout.split()[0]  # the pending message's id
    moved = run_cli(env, "reschedule", key, "--delay", "20m", "--json")
    assert moved.returncode == 0 and '"outcome":"rescheduled"' in moved.stdout
    # the old spelling, for one release: the same answer, and a note naming the new one
    again = run_cli(env, "reschedule", key, "--in", "30m", "--json")
    assert again.returncode == 0 and '"outcome":"rescheduled"' in again.stdout
    assert "--in is deprecated, use --delay" in again.stderr
    listed = run_cli(env, "scheduled", "list", "--key", key, "--json")
    assert f'"key":"{key}","generation":1' in listed.stdout
    off = run_cli(settings_env(shared_topology.settings([dest]), schedule_journal="false"), *args)
    assert off.returncode == 1 and "needs the schedule journal" in off.stderr
