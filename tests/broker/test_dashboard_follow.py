"""The dashboard's store follower on a real journal stream: a checkpoint or the journal,
then live.

The reference is what ``scheduled list`` reads (:meth:`AsyncPublisher.list_scheduled`):
the follower's pages must list the same copies, in the same order, before and after
publishes, a cancel, a reschedule and a keyed replace that came while it was following,
whether it began from the journal, from a checkpoint, or from a store it saved.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aio_pika
import pytest

from rmqdelay import AsyncPublisher, Settings, TopologyError
from rmqdelay.amqp.checkpoints import write_checkpoint
from rmqdelay.amqp.topology_manager import TopologyManager
from rmqdelay.core.journal.records import JournalRecord, journal_name
from rmqdelay.dashboard.follow import StoreFollower
from rmqdelay.dashboard.pages import PageQuery
from rmqdelay.dashboard.store import ScheduleStore
from tests.helpers.brokerctl import BrokerAdmin, with_login
from tests.helpers.worker_helpers import make_settings

DESTINATIONS = ("index-a", "index-b")


@pytest.fixture
def settings(amqp_url: str, prefix: str) -> Settings:
    return make_settings(amqp_url, prefix, DESTINATIONS, max_delay="2h")


def _copies(rows: object) -> list[tuple[str, int]]:
    return [(r.message_id, r.due_at_ms) for r in rows]  # type: ignore[attr-defined]


async def _all_pages(follower: StoreFollower, limit: int = 3) -> list[JournalRecord]:
    rows: list[JournalRecord] = []
    query = PageQuery(limit=limit)
    now = time.time_ns() // 10**6
    while True:
        page = follower.store.page(query, now)
        rows += page.rows
        if page.next_cursor is None:
            return rows
        query = PageQuery(limit=limit, after=page.next_cursor)


async def _agrees(follower: StoreFollower, publisher: AsyncPublisher) -> list[JournalRecord]:
    """The follower, caught up, pages what ``scheduled list`` lists; returns it."""
    await follower.caught_up(timeout=20)
    listed = await publisher.list_scheduled()
    assert _copies(await _all_pages(follower)) == _copies(listed)
    return listed


async def test_the_follower_reads_the_journal_then_follows_it_live(settings: Settings) -> None:
    a, b = DESTINATIONS
    connection = await aio_pika.connect(settings.url.get_secret_value())
    try:
        async with AsyncPublisher(settings) as publisher:
            early = [
                await publisher.publish(a if i % 2 else b, b"x", delay=600 + i) for i in range(7)
            ]
            follower = await StoreFollower(connection, settings, ScheduleStore()).start()
            try:
                await follower.caught_up(timeout=20)
                listed = await _agrees(follower, publisher)
                assert len(listed) == 7
                assert follower.store.by_destination(time.time_ns() // 10**6) == {a: 3, b: 4}

                later = [await publisher.publish(a, b"y", delay=300 + i) for i in range(4)]
                keyed = await publisher.publish(b, b"k", delay=900, key="k1", on_conflict="ignore")
                await publisher.cancel(early[0].message_id, later[1].message_id)
                await publisher.reschedule(early[3].message_id, delay=1500)
                replaced = await publisher.publish(
                    b, b"k2", delay=1200, key="k1", on_conflict="replace"
                )
                listed = await _agrees(follower, publisher)
                assert len(listed) == 7 + 4 - 2 + 1  # the keyed one replaced, its replacement
                ids = {r.message_id for r in listed}
                assert early[0].message_id not in ids and keyed.message_id not in ids
                assert replaced.message_id in ids
                assert listed[-1].message_id == early[3].message_id  # moved to the end

                now = time.time_ns() // 10**6
                first = follower.store.page(PageQuery(destination=a, order="newest", limit=2), now)
                assert first.total == 3 + 4 - 1
                assert _copies(first.rows) == _copies(
                    sorted(
                        (r for r in listed if r.destination == a),
                        key=lambda r: (-r.recorded_at_ms, r.message_id, r.due_at_ms),
                    )[:2]
                )
                key_page = follower.store.page(PageQuery(key="k1"), now)
                assert [r.message_id for r in key_page.rows] == [replaced.message_id]
                history = follower.store.history(early[0].message_id)
                assert [r.kind for r in history] == ["scheduled", "cancelled"]
                moved = follower.store.history(early[3].message_id)
                assert [r.kind for r in moved] == ["scheduled", "rescheduled"]
            finally:
                await follower.close()
    finally:
        await connection.close()


async def test_a_missing_journal_names_the_command_that_makes_it(
    amqp_url: str, prefix: str
) -> None:
    bare = Settings(url=amqp_url, prefix=prefix, max_delay="1m")
    connection = await aio_pika.connect(amqp_url)
    try:
        with pytest.raises(TopologyError, match="rmqdelay topology apply"):
            await StoreFollower(connection, bare, ScheduleStore()).start()
    finally:
        await connection.close()


async def test_a_user_who_may_only_read_follows_without_writing(
    settings: Settings, admin: BrokerAdmin, amqp_url: str, prefix: str
) -> None:
    """Refused the marker's write, the follower reads to the end the stream shows, and
    again after later writes; ``exact`` says its view may be catching up."""
    a, _b = DESTINATIONS
    name = f"{prefix}-reader"
    admin.add_user(name, "reader-Pw-5d1f", "^$", "^$", ".*")
    try:
        async with AsyncPublisher(settings) as publisher:
            early = [await publisher.publish(a, b"x", delay=600 + i) for i in range(3)]
            connection = await aio_pika.connect(with_login(amqp_url, name, "reader-Pw-5d1f"))
            try:
                follower = await StoreFollower(connection, settings, ScheduleStore()).start()
                try:
                    assert not follower.exact
                    await follower.caught_up(timeout=20)
                    assert _copies(await _all_pages(follower)) == _copies(
                        await publisher.list_scheduled()
                    )
                    later = await publisher.publish(a, b"y", delay=300)
                    await publisher.cancel(early[1].message_id)
                    await follower.caught_up(timeout=20)
                    rows = await _all_pages(follower)
                    assert _copies(rows) == _copies(await publisher.list_scheduled())
                    assert rows[0].message_id == later.message_id
                    assert early[1].message_id not in {r.message_id for r in rows}
                    assert not connection.is_closed
                finally:
                    await follower.close()
            finally:
                await connection.close()
    finally:
        admin.delete_user(name)


async def test_a_follower_begins_from_the_latest_checkpoint(settings: Settings) -> None:
    """Begun from a checkpoint, the follower reads only the journal after what it covers,
    and pages what ``scheduled list`` lists."""
    a, b = DESTINATIONS
    async with AsyncPublisher(settings) as publisher:
        before = [await publisher.publish(a, b"x", delay=600 + i) for i in range(20)]
        await publisher.cancel(before[2].message_id)
        written = await asyncio.to_thread(write_checkpoint, settings, writer="test")
        assert written.outcome == "written" and written.pointer is not None
        after = [await publisher.publish(b, b"y", delay=400 + i) for i in range(3)]
        connection = await aio_pika.connect(settings.url.get_secret_value())
        try:
            follower = await StoreFollower(connection, settings, ScheduleStore()).start()
            try:
                assert follower.pointer.id == written.pointer.id
                listed = await _agrees(follower, publisher)
                assert len(listed) == 20 - 1 + 3
                assert follower.records == len(after)  # the journal after the checkpoint
                assert before[2].message_id not in {r.message_id for r in listed}
            finally:
                await follower.close()
        finally:
            await connection.close()


async def test_a_restarted_follower_reads_on_from_its_saved_store(
    settings: Settings, tmp_path: Path
) -> None:
    """Closed, the store is saved with the offset it covers; opened again, only what the
    journal got since is read. A store whose journal was made anew is read afresh."""
    a, _b = DESTINATIONS
    path = tmp_path / "store.sqlite3"
    async with AsyncPublisher(settings) as publisher:
        first = [await publisher.publish(a, b"x", delay=600 + i) for i in range(5)]
        connection = await aio_pika.connect(settings.url.get_secret_value())
        try:
            follower = await StoreFollower(connection, settings, ScheduleStore(path)).start()
            await _agrees(follower, publisher)
            await follower.close()
            follower.store.close()

            later = await publisher.publish(a, b"y", delay=300)
            await publisher.cancel(first[0].message_id)
            again = await StoreFollower(connection, settings, ScheduleStore(path)).start()
            try:
                listed = await _agrees(again, publisher)
                assert again.records == 2  # the publish and the cancel, not the first five
                assert {r.message_id for r in listed} == {m.message_id for m in (*first[1:], later)}
            finally:
                await again.close()
                again.store.close()
        finally:
            await connection.close()


async def test_a_saved_store_of_a_journal_made_anew_is_read_afresh(
    settings: Settings, tmp_path: Path
) -> None:
    a, _b = DESTINATIONS
    path = tmp_path / "store.sqlite3"
    connection = await aio_pika.connect(settings.url.get_secret_value())
    try:
        async with AsyncPublisher(settings) as publisher:
            for i in range(4):
                await publisher.publish(a, b"x", delay=600 + i)
            follower = await StoreFollower(connection, settings, ScheduleStore(path)).start()
            await _agrees(follower, publisher)
            await follower.close()
            follower.store.close()
        # the journal deleted and declared anew (as `topology destroy` then `apply` do)
        channel = await connection.channel()
        await channel.queue_delete(journal_name(settings.layout))
        await channel.close()
        with TopologyManager(settings) as manager:
            manager.apply(list(DESTINATIONS))
        async with AsyncPublisher(settings) as publisher:
            fresh = await publisher.publish(a, b"z", delay=900)
            again = await StoreFollower(connection, settings, ScheduleStore(path)).start()
            try:
                listed = await _agrees(again, publisher)
                assert [r.message_id for r in listed] == [fresh.message_id]
            finally:
                await again.close()
                again.store.close()
    finally:
        await connection.close()
