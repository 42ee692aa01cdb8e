"""What the checkpoint tests share (tests/broker/test_checkpoints.py on one broker,
tests/cluster/test_checkpoint_failover.py on a cluster): the reference (the whole
journal folded), the fill, the writer watched, and what must hold after a writer was cut
off half-way."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from rmqdelay import Context, Publisher, Settings, Worker
from rmqdelay.amqp import pika_private
from rmqdelay.amqp.checkpoints import write_checkpoint
from rmqdelay.amqp.connections import connect_blocking
from rmqdelay.amqp.journal import read_once
from rmqdelay.core.clock import now_ms
from rmqdelay.core.journal import flows
from rmqdelay.core.journal.checkpoint import HEADER, LEASE_MS, Mark, checkpoint_name
from rmqdelay.core.journal.reading import latest
from rmqdelay.core.journal.view import ScheduleView
from rmqdelay.core.journal.writer import Written, write
from rmqdelay.worker import Delivery, Settled, WorkerHook
from tests.helpers.cli import CLI, settings_env
from tests.helpers.worker_helpers import wait_until

DEST = "ckpt"
HOUR_S = 3600
Mode = Literal["ignore", "replace"]


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


def keys_agree(settings: Settings, keys: list[str]) -> None:
    """A keyed publish (``ignore``) of each key is ignored in favour of the message the
    whole journal says is the key's current one."""
    view = reference(settings)
    with Publisher(settings) as publisher:
        for key in keys:
            current = view.keys.current(key)
            again = publisher.publish(DEST, b"x", delay="2h", key=key, on_conflict="ignore")
            assert current is not None and again.message_id == current.message_id


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


@dataclass
class Before:
    """What was written before the writer that is cut off: a checkpoint, and after it a
    tail with cancels, keys replaced, and messages due at once for a worker."""

    ids: list[str]
    previous: str
    """The id of the checkpoint before."""
    replaced: dict[str, str]
    soon: list[str]
    """Five messages due at once, the first two cancelled."""
    first: str
    """A keyed message due at once, replaced by :attr:`second`."""
    second: str


def write_before(settings: Settings, bulk_count: int = 6000) -> Before:
    with Publisher(settings) as publisher:
        ids = bulk(publisher, bulk_count, 4096, "bulk")  # 24 MB of bodies: about 100 parts
        assert [r.outcome for r in publisher.cancel(*ids[:10])] == ["cancelled"] * 10
        for i in range(20):
            keyed(publisher, f"k{i}", "ignore")
    previous = write_checkpoint(settings, writer="test-previous")
    assert previous.outcome == "written" and previous.pointer is not None
    with Publisher(settings) as publisher:  # the tail after it
        bulk(publisher, 200, 512, "tail")
        assert publisher.cancel(ids[10])[0].outcome == "cancelled"
        replaced = {f"k{i}": keyed(publisher, f"k{i}", "replace") for i in range(5)}
        soon = [publisher.publish(DEST, {"n": i}, delay="1s").message_id for i in range(5)]
        assert [r.outcome for r in publisher.cancel(*soon[:2])] == ["cancelled"] * 2
        first = keyed(publisher, "soon-key", "replace", delay="1s")
        second = keyed(publisher, "soon-key", "replace", delay="2s")
    return Before(ids, previous.pointer.id, replaced, soon, first, second)


def start_writer(settings: Settings, marks: list[Mark]) -> subprocess.Popen[bytes]:
    """``rmqdelay scheduled checkpoint`` in a process of its own, returned once it writes
    the copies (``marks``: :func:`watching`'s)."""
    writer = subprocess.Popen(
        [*CLI, "scheduled", "checkpoint"],
        env=settings_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not any(m.part in ("copies", "bodies") for m in marks):
        assert writer.poll() is None, writer.communicate()
        assert time.monotonic() < deadline, "the writer wrote no copies in 120 s"
        time.sleep(0.005)
    return writer


def cut_half_way(settings: Settings, before: Before) -> Mark:
    """The checkpoint stream's last message is a part of a checkpoint not committed,
    naming the one before as the latest."""
    cut = last_mark(settings)
    assert cut.id != before.previous and cut.part != "commit", (
        "the writer finished before it was cut off: the test needs a bigger state"
    )
    assert cut.latest.id == before.previous
    return cut


class Settles(WorkerHook):
    def __init__(self) -> None:
        self.count = 0

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        self.count += 1


def check_after(settings: Settings, before: Before) -> None:
    """After the cut-off writer: readers use the previous checkpoint and agree with the
    whole journal; the next writer waits for the lease, then writes; a worker started
    from it drops what was cancelled and handles each key once."""
    assert last_mark(settings).latest.id == before.previous
    whole = agree(settings)
    assert not {before.ids[10], before.ids[11]} & {c[0] for c in whole}
    view = reference(settings)
    for key, message_id in before.replaced.items():
        current = view.keys.current(key)
        assert current is not None and current.message_id == message_id

    assert write_checkpoint(settings, writer="test-after").outcome == "busy"  # its lease
    after = write_later(settings, "test-after", LEASE_MS)
    assert after.outcome == "written" and after.pointer is not None
    assert last_mark(settings).latest.id == after.pointer.id
    agree(settings)

    handled: list[str] = []
    settles = Settles()
    app = Worker(settings, hooks=[settles])

    @app.handler(DEST)
    async def handle(msg: Any, ctx: Context) -> None:
        handled.append(ctx.message_id)

    async def run() -> None:
        async with app.running(concurrency=4):
            # every copy due at once settled: handled, cancelled or dropped (the replaced)
            await wait_until(lambda: settles.count >= 7, 60, lambda: f"7 settled: {handled}")

    asyncio.run(run())
    assert sorted(handled) == sorted([*before.soon[2:], before.second])
