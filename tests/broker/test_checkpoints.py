"""Checkpoints on a real broker: a writer cut off half-way, two at once, readers that
start during one, and publishes, cancels and keyed publishes at full rate while they
are written.

The reference is the whole journal folded (:func:`rmqdelay.core.journal.flows.read`,
every record from the first): a reader that starts from the latest checkpoint and reads
the tail after it must list the same copies, in the same order, and give the same key
verdicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

import pytest

from rmqdelay import Context, Publisher, Settings, Worker
from rmqdelay.amqp import pika_private
from rmqdelay.amqp.connections import connect_blocking
from rmqdelay.amqp.journal import read_once, write_checkpoint
from rmqdelay.core.clock import now_ms
from rmqdelay.core.journal import flows
from rmqdelay.core.journal.checkpoint import HEADER, LEASE_MS, Mark, checkpoint_name
from rmqdelay.core.journal.reading import latest
from rmqdelay.core.journal.view import ScheduleView
from rmqdelay.core.journal.writer import Written, write
from tests.helpers.cli import CLI, settings_env
from tests.helpers.worker_helpers import make_settings, wait_until

pytestmark = pytest.mark.broker

DEST = "ckpt"
HOUR_S = 3600
Mode = Literal["ignore", "replace"]


@pytest.fixture
def settings(amqp_url: str, prefix: str) -> Settings:
    """A journal of the test's own (with bodies: a checkpoint then carries them)."""
    return make_settings(amqp_url, prefix, [DEST], max_delay="3h", journal_bodies=True)


def reference(settings: Settings) -> ScheduleView:
    """The whole journal, folded: what every reader must agree with."""
    records = read_once(settings, flows.read(settings.layout, since_ms=0, timeout=60))
    return ScheduleView().extend(records)


def copies(records: Any) -> list[tuple[str, int]]:
    return [(r.message_id, r.due_at_ms) for r in records]


def agree(settings: Settings) -> list[tuple[str, int]]:
    """A fresh reader's list (the latest checkpoint and its tail) is the whole journal's;
    and its first page is the whole journal's first. Only copies due in more than a
    minute are compared (both reads take a moment)."""
    horizon = now_ms() + 60_000
    whole = copies(reference(settings).pending(horizon))
    with Publisher(settings) as publisher:
        listed = [c for c in copies(publisher.list_scheduled()) if c[1] > horizon]
        first = [c for c in copies(publisher.list_scheduled(limit=50)) if c[1] > horizon]
    assert listed == whole
    assert first and first == whole[: len(first)]
    return whole


def bulk(publisher: Publisher, count: int, body_bytes: int, tag: str) -> list[str]:
    """``count`` messages an hour or more ahead, ``body_bytes`` each."""
    requests = [
        {
            "destination": DEST,
            "body": bytes([65 + i % 26]) * body_bytes,
            "delay": f"{HOUR_S + i % 900}s",
            "message_id": f"{tag}-{i}",
        }
        for i in range(count)
    ]
    return [r.message_id for r in publisher.publish_many(requests)]


def keyed(publisher: Publisher, key: str, mode: Mode, delay: str = "2h") -> str:
    return publisher.publish(DEST, {"key": key}, delay=delay, key=key, on_conflict=mode).message_id


def last_mark(settings: Settings) -> Mark:
    found = read_once(settings, latest(settings.layout, 10))
    assert isinstance(found, Mark), found
    return found


def write_later(settings: Settings, writer: str, later_ms: int) -> Written:
    """A checkpoint written as if ``later_ms`` had passed (a writer's lease is its last
    part's age: how a crashed writer's checkpoint is left behind)."""
    flow = write(settings.layout, writer=writer, timeout=60, clock=lambda: now_ms() + later_ms)
    return read_once(settings, flow)


@contextlib.contextmanager
def watching(settings: Settings) -> Iterator[list[Mark]]:
    """The checkpoint stream's marks as they are appended from now on (a thread)."""
    import pika

    marks: list[Mark] = []
    stop = threading.Event()
    ready = threading.Event()

    def follow() -> None:
        connection = connect_blocking(settings, "test-watch")
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)

        def take(ch: Any, method: Any, properties: pika.BasicProperties, body: bytes) -> None:
            mark = Mark.of_header((properties.headers or {}).get(HEADER))
            if mark is not None:
                marks.append(mark)
            ch.basic_ack(method.delivery_tag)

        channel.basic_consume(
            checkpoint_name(settings.layout), take, arguments={"x-stream-offset": "next"}
        )
        ready.set()
        while not stop.is_set():
            connection.process_data_events(time_limit=0.01)
        pika_private.drop_deliveries(channel)  # a reject would close the connection
        with contextlib.suppress(Exception):
            connection.close()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    assert ready.wait(30), "the checkpoint stream's watcher did not start"
    try:
        yield marks
    finally:
        stop.set()
        thread.join(30)


def test_a_writer_killed_half_way_leaves_readers_on_the_previous_checkpoint(
    settings: Settings,
) -> None:
    """``rmqdelay scheduled checkpoint`` is stopped once its copies are being written,
    readers are asked meanwhile, then it is SIGKILLed: readers go on from the previous
    checkpoint and agree with the whole journal; the next writer waits for the lease,
    then writes; a worker started after drops what was cancelled and handles each key
    once."""
    with Publisher(settings) as publisher:
        ids = bulk(publisher, 6000, 4096, "bulk")  # 24 MB of bodies: about 100 parts
        assert [r.outcome for r in publisher.cancel(*ids[:10])] == ["cancelled"] * 10
        for i in range(20):
            keyed(publisher, f"k{i}", "ignore")
    previous = write_checkpoint(settings, writer="test-previous")
    assert previous.outcome == "written" and previous.pointer is not None

    with Publisher(settings) as publisher:  # the tail after it
        bulk(publisher, 200, 512, "tail")
        assert publisher.cancel(ids[10])[0].outcome == "cancelled"
        replaced = {f"k{i}": keyed(publisher, f"k{i}", "replace") for i in range(5)}
        # what a worker handles at the end: two cancelled, one key replaced
        soon = [publisher.publish(DEST, {"n": i}, delay="1s").message_id for i in range(5)]
        assert [r.outcome for r in publisher.cancel(*soon[:2])] == ["cancelled"] * 2
        first = keyed(publisher, "soon-key", "replace", delay="1s")
        second = keyed(publisher, "soon-key", "replace", delay="2s")

    with watching(settings) as marks:
        writer = subprocess.Popen(
            [*CLI, "scheduled", "checkpoint"],
            env=settings_env(settings),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            deadline = time.monotonic() + 120
            while not any(m.part in ("copies", "bodies") for m in marks):
                assert writer.poll() is None, writer.communicate()
                assert time.monotonic() < deadline, "the writer wrote no copies in 120 s"
                time.sleep(0.005)
            writer.send_signal(signal.SIGSTOP)
            cut = last_mark(settings)
            assert cut.id != previous.pointer.id and cut.part != "commit", (
                "the writer finished before it was stopped: the test needs a bigger state"
            )
            assert cut.latest.id == previous.pointer.id

            # readers starting while a checkpoint is under way use the previous one
            agree(settings)
            with Publisher(settings) as publisher:
                assert publisher.cancel(ids[11])[0].outcome == "cancelled"
                again = publisher.publish(DEST, b"x", delay="2h", key="k7", on_conflict="ignore")
                assert again.outcome == "ignored" and again.message_id != ""
            assert write_checkpoint(settings, writer="test-second").outcome == "busy"
        finally:
            writer.kill()  # SIGKILL, stopped or not
            writer.wait(30)
    assert writer.returncode == -signal.SIGKILL

    # the cut-off checkpoint is named by no pointer: readers use the previous one
    assert last_mark(settings).latest.id == previous.pointer.id
    whole = agree(settings)
    assert not {ids[10], ids[11]} & {c[0] for c in whole}
    view = reference(settings)
    for key, message_id in replaced.items():
        current = view.keys.current(key)
        assert current is not None and current.message_id == message_id

    # the lease: a writer waits while the cut-off one's last part is recent, then writes
    after = write_later(settings, "test-after", LEASE_MS)
    assert after.outcome == "written" and after.pointer is not None
    assert last_mark(settings).latest.id == after.pointer.id
    agree(settings)

    # a worker started now (from that checkpoint): no cancel forgotten, each key once
    handled: list[str] = []
    app = Worker(settings)

    @app.handler(DEST)
    async def handle(msg: Any, ctx: Context) -> None:
        handled.append(ctx.message_id)

    async def run() -> None:
        async with app.running(concurrency=4):
            await wait_until(lambda: len(handled) >= 4, 60, lambda: f"4 handled: {handled}")
            await asyncio.sleep(2.0)  # room for a copy that should not be handled

    asyncio.run(run())
    assert sorted(handled) == sorted([*soon[2:], second])
    assert first not in handled


def test_two_writers_at_once_leave_one_latest_checkpoint_every_reader_agrees_with(
    settings: Settings,
) -> None:
    with Publisher(settings) as publisher:
        ids = bulk(publisher, 3000, 1024, "two")
        publisher.cancel(*ids[:20])
        for i in range(30):
            keyed(publisher, f"t{i}", "ignore" if i % 2 else "replace")
    barrier = threading.Barrier(2)
    outcomes: list[Written] = []

    def one(name: str) -> None:
        barrier.wait(30)
        outcomes.append(write_checkpoint(settings, writer=name))

    threads = [threading.Thread(target=one, args=(f"writer-{n}",)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(180)
    assert len(outcomes) == 2
    assert {w.outcome for w in outcomes} <= {"written", "busy"}
    written = [w.pointer.id for w in outcomes if w.outcome == "written" and w.pointer]
    assert written, outcomes
    assert last_mark(settings).latest.id in written
    agree(settings)
    view = reference(settings)
    with Publisher(settings) as publisher:
        for i in range(30):
            current = view.keys.current(f"t{i}")
            again = publisher.publish(DEST, b"x", delay="2h", key=f"t{i}", on_conflict="ignore")
            assert current is not None and again.message_id == current.message_id


def test_publishing_cancelling_and_keyed_publishing_at_full_rate_while_checkpoints_are_written(
    settings: Settings,
) -> None:
    """A thread writes checkpoints back to back while publishers publish, cancel and
    publish keyed messages, and a reader lists the first page: nothing is missed."""
    with Publisher(settings) as publisher:
        bulk(publisher, 2000, 1024, "base")
    stop = threading.Event()
    results: list[Written] = []
    errors: list[BaseException] = []

    def checkpoints() -> None:
        try:
            while not stop.is_set():
                results.append(write_checkpoint(settings, writer="test-loop"))
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            with Publisher(settings) as publisher:
                while not stop.is_set():
                    assert len(publisher.list_scheduled(limit=50)) == 50
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=checkpoints), threading.Thread(target=reader)]
    for thread in threads:
        thread.start()
    cancelled: list[str] = []
    try:
        with Publisher(settings) as publisher:
            rounds = 0
            while rounds < 40 or sum(r.outcome == "written" for r in results) < 3:
                assert rounds < 400 and not errors, errors
                ids = bulk(publisher, 100, 256, f"r{rounds}")
                said = publisher.cancel(*ids[::10])
                assert [r.outcome for r in said] == ["cancelled"] * len(said)
                cancelled += ids[::10]
                for i in range(5):
                    key = f"f{(rounds * 5 + i) % 40}"
                    mode: Mode = "replace" if rounds % 3 else "ignore"
                    keyed(publisher, key, mode)
                rounds += 1
    finally:
        stop.set()
        for thread in threads:
            thread.join(180)
    assert not errors, errors
    whole = agree(settings)
    assert not set(cancelled) & {c[0] for c in whole}
    view = reference(settings)
    with Publisher(settings) as publisher:
        for k in range(40):
            current = view.keys.current(f"f{k}")
            again = publisher.publish(DEST, b"x", delay="2h", key=f"f{k}", on_conflict="ignore")
            assert current is not None and again.message_id == current.message_id
    print(f"\n{rounds} rounds, checkpoints: {[r.outcome for r in results]}")
