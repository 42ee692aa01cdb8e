"""Checkpoints on a real broker: a writer cut off half-way, two at once, readers that
start during one, and publishes, cancels and keyed publishes at full rate while they
are written.

The reference is the whole journal folded (:func:`rmqdelay.core.journal.flows.read`,
every record from the first): a reader that starts from the latest checkpoint and reads
the tail after it must list the same copies, in the same order, and give the same key
verdicts.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from typing import Any

import pytest

from rmqdelay import Publisher, Settings, Worker
from rmqdelay.amqp.checkpoints import write_checkpoint
from rmqdelay.amqp.journal import read_once
from rmqdelay.core.journal.checkpoint import GENESIS, Mark
from rmqdelay.core.journal.reading import latest
from rmqdelay.core.journal.writer import Written
from rmqdelay.worker.context import Context
from tests.helpers.checkpoints import (
    DEST,
    Mode,
    agree,
    bulk,
    check_after,
    cut_half_way,
    keyed,
    keys_agree,
    last_mark,
    start_writer,
    watching,
    write_before,
)
from tests.helpers.worker_helpers import make_settings, wait_until

pytestmark = pytest.mark.broker


@pytest.fixture
def settings(amqp_url: str, prefix: str) -> Settings:
    """A journal of the test's own (with bodies: a checkpoint then carries them)."""
    return make_settings(amqp_url, prefix, [DEST], max_delay="3h", journal_bodies=True)


def test_a_writer_killed_half_way_leaves_readers_on_the_previous_checkpoint(
    settings: Settings,
) -> None:
    """``rmqdelay scheduled checkpoint`` is stopped once its copies are being written,
    readers are asked meanwhile, then it is SIGKILLed: what :func:`check_after` says
    holds."""
    before = write_before(settings)
    with watching(settings) as marks:
        writer = start_writer(settings, marks)
        try:
            writer.send_signal(signal.SIGSTOP)
            cut_half_way(settings, before)
            # readers starting while a checkpoint is under way use the previous one
            agree(settings)
            with Publisher(settings) as publisher:
                assert publisher.cancel(before.ids[11])[0].outcome == "cancelled"
                again = publisher.publish(DEST, b"x", delay="2h", key="k7", on_conflict="ignore")
                assert again.outcome == "ignored" and again.message_id != ""
            assert write_checkpoint(settings, writer="test-second").outcome == "busy"
        finally:
            writer.kill()  # SIGKILL, stopped or not
            writer.wait(30)
    assert writer.returncode == -signal.SIGKILL
    check_after(settings, before)


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
    keys_agree(settings, [f"t{i}" for i in range(30)])


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
    keys_agree(settings, [f"f{k}" for k in range(40)])
    print(f"\n{rounds} rounds, checkpoints: {[r.outcome for r in results]}")


async def test_a_publisher_writes_a_checkpoint_on_the_side_when_no_writer_spoke_for_long(
    settings: Settings,
) -> None:
    """No writer spoke for QUIET_MS (a worker stopped long ago): the first publish of an
    AsyncPublisher starts a checkpoint in a thread and returns; closing waits for it."""
    from rmqdelay import AsyncPublisher
    from rmqdelay.amqp.journal import read_once
    from rmqdelay.core.clock import now_ms
    from rmqdelay.core.journal.checkpoint import QUIET_MS
    from rmqdelay.core.journal.writer import heartbeat

    with Publisher(settings) as publisher:
        bulk(publisher, 500, 100, "quiet")
    gone = now_ms() - QUIET_MS - 1000
    beat = heartbeat(settings.layout, last_mark(settings), writer="gone", clock=lambda: gone)
    read_once(settings, beat)
    async with AsyncPublisher(settings) as publisher:
        await publisher.publish(DEST, b"x", delay="2h")
        assert publisher._checkpointing is not None  # started, on the side
    mark = last_mark(settings)
    assert mark.part == "commit" and mark.writer not in ("gone", "")
    agree(settings)


async def test_a_worker_writes_its_checkpoint_in_a_process_of_its_own(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal outgrew what no checkpoint covers (over 1 MiB): a running worker writes
    one, in a child interpreter. The worker's own ``write_checkpoint`` refuses here, so
    only another process can have written it; then every reader agrees with it."""
    from rmqdelay.amqp import checkpoints
    from rmqdelay.worker import checkpoints as worker_checkpoints

    with Publisher(settings) as publisher:
        bulk(publisher, 1500, 1024, "aside")

    def refuse(*_args: Any, **_kwargs: Any) -> Written:
        raise AssertionError("written in the worker's own process")

    monkeypatch.setattr(checkpoints, "write_checkpoint", refuse)
    monkeypatch.setattr(worker_checkpoints, "CHECK_S", 0.2)
    mine = f"{socket.gethostname()}:{os.getpid()}:"
    app = Worker(settings)

    @app.handler(DEST)
    async def handle(msg: Any, ctx: Context) -> None:
        pass

    def written() -> bool:
        found = read_once(settings, latest(settings.layout, 10))
        return isinstance(found, Mark) and found.part == "commit" and found.writer.startswith(mine)

    async with app.running(concurrency=4):
        await wait_until(written, 60, "the worker's checkpoint", interval=0.5)
    agree(settings)


def test_a_checkpoint_process_that_fails_says_why_without_the_password(
    settings: Settings, capfd: pytest.CaptureFixture[str]
) -> None:
    from dataclasses import replace

    from rmqdelay.amqp.checkpoints import write_in_child
    from rmqdelay.settings import SecretUrl

    closed = replace(settings, url=SecretUrl("amqp://guest:s3cr3t-pw@127.0.0.1:1/%2F"))
    with pytest.raises(RuntimeError) as failed:
        write_in_child(closed, "test-closed", "none")
    assert "cannot connect to amqp://guest:***@127.0.0.1:1/" in str(failed.value)
    assert "s3cr3t-pw" not in str(failed.value) + "".join(capfd.readouterr())


def test_where_no_process_starts_the_checkpoint_is_written_in_this_one(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from rmqdelay.amqp.checkpoints import write_in_child

    with Publisher(settings) as publisher:
        bulk(publisher, 200, 100, "thread")
    found = read_once(settings, latest(settings.layout, 10))  # a publisher may have written one
    after = found.latest.id if isinstance(found, Mark) else GENESIS.id
    monkeypatch.setattr(sys, "executable", "")
    with caplog.at_level(logging.WARNING):
        written = write_in_child(settings, "test-thread", after)
    assert written.outcome == "written" and written.pointer is not None
    assert "checkpoint written in this process: none could be started" in caplog.text
    assert last_mark(settings).writer == "test-thread"
    agree(settings)
