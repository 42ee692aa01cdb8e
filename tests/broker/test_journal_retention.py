"""The journal's retention by size on a real broker, and a journal of the previous release.

- What a checkpoint covers survives the retention deleting its records: a journal that
  only publishers write to (no worker, no dashboard) gets its checkpoints from them, and
  a reader finds everything pending, cancelled and keyed after the records are gone; a
  stretch deleted before any checkpoint covered it is reported, not passed over.
- A journal declared by the previous release (``x-max-age``, no checkpoint stream) is
  read as it is, and moved to the new retention by the step ``topology apply`` prints
  (a policy: a stream's arguments cannot change).
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pika
import pytest

from rmqdelay import Publisher, Settings
from rmqdelay.amqp.checkpoints import write_checkpoint
from rmqdelay.amqp.journal import read_once
from rmqdelay.core.clock import now_ms
from rmqdelay.core.journal import reading
from rmqdelay.core.journal.checkpoint import QUIET_MS, Mark, checkpoint_name
from rmqdelay.core.journal.reading import JournalFlow, latest
from rmqdelay.core.journal.records import JournalRecord, encode_record, journal_name
from rmqdelay.core.journal.steps import Read, StreamMessage
from rmqdelay.core.journal.writer import heartbeat
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.cli import CLI, settings_env
from tests.helpers.worker_helpers import make_settings

pytestmark = pytest.mark.broker

DEST = "kept"
MB = 1024**2


def first_offset(settings: Settings) -> int:
    """The offset of the journal's first message still held."""
    found: list[int] = []

    def take(message: StreamMessage) -> bool:
        found.append(message.offset)
        return True

    def flow() -> JournalFlow[None]:
        yield Read(journal_name(settings.layout), "first", take, 10.0, prefetch=1)

    read_once(settings, flow())
    return found[0]


def history(settings: Settings, megabytes: int) -> None:
    """Records of messages delivered an hour ago, ``megabytes`` of them: other
    publishers' traffic, which no reader needs."""
    due = now_ms() - 3_600_000
    pad = {"pad": "h" * 3000}
    per_write = 300
    count = megabytes * MB // 3100
    for start in range(0, count, per_write):
        records = [
            JournalRecord("scheduled", f"old-{i}", DEST, due, headers=pad, recorded_at_ms=due)
            for i in range(start, min(count, start + per_write))
        ]
        read_once(settings, reading.append(settings.layout, records))


def last_mark(settings: Settings) -> Mark:
    found = read_once(settings, latest(settings.layout, 10))
    assert isinstance(found, Mark), found
    return found


# writes about 300 MB of journal and waits out the retention on a loaded CI machine
@pytest.mark.timeout(900)
def test_what_a_checkpoint_covers_outlives_the_records_the_retention_deletes(
    amqp_url: str, prefix: str
) -> None:
    settings = make_settings(amqp_url, prefix, [DEST], max_delay="3h", journal_retention="64MiB")
    with Publisher(settings) as publisher:
        ids = [
            publisher.publish(DEST, {"n": i}, delay=f"{7200 + i}s").message_id for i in range(30)
        ]
        assert [r.outcome for r in publisher.cancel(*ids[:5])] == ["cancelled"] * 5
        keys = {
            f"r{i}": publisher.publish(
                DEST, b"k", delay="2h", key=f"r{i}", on_conflict="ignore"
            ).message_id
            for i in range(5)
        }
    # no writer has spoken for QUIET_MS (the last one, a worker, stopped long ago): the
    # next publisher's first publish writes a checkpoint itself
    gone = now_ms() - QUIET_MS - 1000
    read_once(
        settings, heartbeat(settings.layout, last_mark(settings), writer="gone", clock=lambda: gone)
    )
    with Publisher(settings) as publisher:
        trigger = publisher.publish(DEST, b"t", delay="2h").message_id
    by_publisher = last_mark(settings)
    assert by_publisher.part == "commit" and by_publisher.writer not in ("gone", "")
    assert by_publisher.latest.covers is not None

    # more traffic than the retention holds; a writer checkpoints in between, as a
    # worker does when the tail outgrows MIN_TAIL_BYTES
    history(settings, 40)
    between = write_checkpoint(settings, writer="test-between")
    assert between.outcome == "written" and between.gap is None
    history(settings, 60)
    assert first_offset(settings) > by_publisher.latest.covers  # the first records are gone

    expected = sorted([*ids[5:], *keys.values(), trigger])
    with Publisher(settings) as publisher:
        listed = publisher.list_scheduled()
        assert sorted(r.message_id for r in listed) == expected
        # known still, though its records are gone: a second cancel answers as the first
        assert [r.outcome for r in publisher.cancel(ids[0], ids[5])] == ["cancelled"] * 2
        again = publisher.publish(DEST, b"k", delay="2h", key="r1", on_conflict="ignore")
        assert again.outcome == "ignored" and again.message_id == keys["r1"]

    # 100 MB more with no checkpoint in between: the stretch after the last checkpoint
    # is deleted too, and the next checkpoint says so
    history(settings, 100)
    answer = subprocess.run(
        [*CLI, "scheduled", "checkpoint"],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert answer.returncode == 0, answer.stderr
    assert "deleted by its retention before a checkpoint covered them" in answer.stderr


def _declare_previous_release(settings: Settings) -> None:
    """The journal as rmqdelay declared it before checkpoints: a stream kept by age, its
    fanout exchange, no checkpoint stream."""
    name = journal_name(settings.layout)
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        channel.exchange_declare(name, "fanout", durable=True)
        channel.queue_declare(
            name, durable=True, arguments={"x-queue-type": "stream", "x-max-age": "4h"}
        )
        channel.queue_bind(name, name)
    finally:
        connection.close()


def test_a_journal_of_the_previous_release_is_read_then_moved_by_the_printed_step(
    amqp_url: str, prefix: str, admin: BrokerAdmin
) -> None:
    if not admin.uses_management_api:
        pytest.fail("this test sets a policy through the management API: enable it")
    bare = Settings(url=amqp_url, prefix=prefix, max_delay="3h", connection_name=prefix)
    _declare_previous_release(bare)
    settings = make_settings(amqp_url, prefix, [DEST], max_delay="3h")  # topology apply
    # ... which kept the journal as it was, and made the checkpoint stream
    assert admin.queue(journal_name(settings.layout))["arguments"]["x-max-age"] == "4h"
    assert admin.queue(checkpoint_name(settings.layout))["type"] == "stream"

    now = now_ms()
    old = [
        JournalRecord("scheduled", f"prev-{i}", DEST, now + 7_200_000 + i, recorded_at_ms=now)
        for i in range(20)
    ]
    old.append(JournalRecord("cancelled", "prev-0", DEST, now + 7_200_000, recorded_at_ms=now))
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:  # records as the previous release wrote them, one message each
        channel = connection.channel()
        channel.confirm_delivery()
        for record in old:
            properties = pika.BasicProperties(delivery_mode=2, message_id=record.message_id)
            channel.basic_publish(
                journal_name(settings.layout), "", encode_record(record), properties
            )
    finally:
        connection.close()
    expected = [f"prev-{i}" for i in range(1, 20)]
    with Publisher(settings) as publisher:
        assert [r.message_id for r in publisher.list_scheduled()] == expected

    # the step: `topology apply` prints it; run as printed, through the management API
    applied = subprocess.run(
        [*CLI, "topology", "apply", "-d", DEST],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert applied.returncode == 0, applied.stderr
    step = re.search(
        r"rabbitmqctl set_policy (\S+) '([^']+)' '([^']+)' --apply-to queues", applied.stdout
    )
    assert step is not None, applied.stdout
    name, pattern, definition = step[1], step[2], json.loads(step[3])
    assert definition["max-length-bytes"] == settings.layout.journal_retention
    with admin.policy(name, pattern, definition):
        deadline = time.monotonic() + 30  # the management API shows it within its stats
        while (effective := admin.queue(journal_name(settings.layout))).get("policy") != name:
            assert time.monotonic() < deadline, f"the policy never applied: {effective}"
            time.sleep(0.2)
        assert effective["effective_policy_definition"]["max-length-bytes"] == (
            settings.layout.journal_retention
        )
        written = write_checkpoint(settings, writer="test-moved")
        assert written.outcome == "written"
        with Publisher(settings) as publisher:
            assert [r.message_id for r in publisher.list_scheduled()] == expected
            assert publisher.cancel("prev-3", "nobody")[0].outcome == "cancelled"
            assert publisher.cancel("nobody")[0].outcome == "unknown"
