"""The cancel filter: a hook that skips the copies cancelled through the schedule journal.

It owns the worker's one journal tail; other hooks that fold the journal (keys,
recurring schedules) follow it through :meth:`CancelFilter.follow` instead of reading the
stream again. On each connect it starts from the latest checkpoint (its ``core``:
tombstones, keys, recurring schedules) and reads the journal from the offset that
checkpoint covers, so a worker's start costs what is pending, not what was delivered; its
:class:`~.checkpoints.Checkpointer` writes the next checkpoint when one is due.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol, TypeVar

import aiormq
from aio_pika.abc import AbstractConnection

from ..amqp.journal import JournalTail, run_journal_async
from ..core.clock import now_ms
from ..core.journal.checkpoint import GENESIS, SETTLE_MS, Pointer
from ..core.journal.reading import load_core
from ..core.journal.records import JournalRecord
from ..core.journal.steps import Start, stream_offset
from ..core.journal.tombstones import Tombstones
from ..errors import TopologyError, WorkerError
from ..settings import Settings
from .checkpoints import Checkpointer
from .delivery import Delivery
from .hooks import WorkerHook

__all__ = ["CancelFilter", "Follower"]

log = logging.getLogger("rmqdelay.worker")
T = TypeVar("T")
_EXPIRE_EVERY_MS = 60_000


class Follower(Protocol):
    """A fold of the journal fed by the cancel filter's tail, in stream order."""

    def add(self, record: JournalRecord) -> None:
        """One record; the same stretch may come twice (each connect reads again)."""

    def wants(self, line: bytes) -> bool:
        """Whether a line must be decoded for it (see ``Tombstones.wants``)."""

    def expire(self, now_ms: int) -> object:
        """Forget what can no longer matter (called about once a minute)."""

    def clear(self) -> None:
        """Forget everything: each connect begins again from the latest checkpoint."""

    def restore(self, entry: Mapping[str, Any]) -> None:
        """One entry of that checkpoint's ``core`` (passing over others' kinds)."""


class CancelFilter(WorkerHook):
    """Skip a delivery a tombstone names: its id and its due time, so a cancel skips
    every copy it named, and not a later re-schedule of the id.

    On each connect it reads the journal's tombstones up to now before consuming (so a
    cancel confirmed before the worker (re)started is honoured too), then follows the
    journal live. Losing the journal's channel ends the session: cancels would go unseen.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.read_timeout = settings.confirm_timeout
        self.tombstones = Tombstones()
        self.pointer: Pointer = GENESIS
        """The checkpoint this connect began from."""
        self.reach_ms = 0
        """A copy due before this may have had its record forgotten (settled, and left
        out of the checkpoint): one the keys filter cannot find is handled, not dropped."""
        self.checkpoints = Checkpointer(settings)
        self._tail: JournalTail | None = None
        self._expired_at_ms = 0
        self.followers: list[Follower] = []

    def follow(self, follower: Follower) -> None:
        """Feed ``follower`` every record too, from the next connect on."""
        self.followers.append(follower)

    def _add(self, record: JournalRecord) -> None:
        self.tombstones.add(record)
        for follower in self.followers:
            follower.add(record)

    def _wants(self, line: bytes) -> bool:
        return self.tombstones.wants(line) or any(f.wants(line) for f in self.followers)

    async def _in_time(self, work: Awaitable[T], what: str) -> T:
        """``work`` within the read timeout; a missing journal is the worker's error, a
        late answer the connection's (the runner connects again)."""
        try:
            return await asyncio.wait_for(work, self.read_timeout)
        except TopologyError as exc:
            raise WorkerError(str(exc)) from None
        except asyncio.TimeoutError:
            raise aiormq.exceptions.AMQPConnectionError(f"{what} in time") from None

    async def on_connect(self, connection: AbstractConnection, lost: asyncio.Event) -> None:
        pointer, entries = await self._in_time(
            run_journal_async(load_core(self.layout, timeout=self.read_timeout), connection),
            "the schedule journal's latest checkpoint was not read",
        )
        self._restore(pointer, entries)
        start: Start
        if pointer.covers is not None:
            start = pointer.covers
            self.reach_ms = pointer.at_ms - SETTLE_MS
        else:  # no checkpoint: everything since now - max_delay, as before them
            start = stream_offset(now_ms() - self.layout.max_delay_ms)
            self.reach_ms = now_ms()
        if self.followers:
            tail = JournalTail(connection, self.layout, self._add, start=start, wants=self._wants)
        else:  # the usual worker: not a call more per record
            add, wants = self.tombstones.add, self.tombstones.wants
            tail = JournalTail(connection, self.layout, add, start=start, wants=wants)
        self._tail = tail

        async def read_to_the_end() -> None:
            await tail.start()
            await tail.caught_up.wait()

        await self._in_time(read_to_the_end(), "the schedule journal was not read to its end")
        if tail.channel is not None:
            tail.channel.close_callbacks.add(lambda *_: lost.set())
        log.info(
            "schedule journal read: checkpoint %s, then %d record(s) (%d bytes); "
            "%d cancelled id(s) pending",
            pointer.id if pointer.complete else "none",
            tail.count,
            tail.bytes,
            len(self.tombstones),
        )
        self.checkpoints.start(connection, tail, pointer)

    def _restore(self, pointer: Pointer, entries: list[dict[str, Any]]) -> None:
        """Begin every fold again from the checkpoint's core."""
        self.pointer = pointer
        self.tombstones.clear()
        for follower in self.followers:
            follower.clear()
        for entry in entries:
            self.tombstones.restore(entry)
            for follower in self.followers:
                follower.restore(entry)

    async def on_disconnect(self) -> None:
        await self.checkpoints.stop()
        tail, self._tail = self._tail, None
        if tail is not None:
            await tail.close()

    def before_handle(self, delivery: Delivery) -> bool:
        now = now_ms()
        if now - self._expired_at_ms > _EXPIRE_EVERY_MS:  # forget tombstones past their time
            self.tombstones.expire(now)
            for follower in self.followers:
                follower.expire(now)
            self._expired_at_ms = now
        return self.tombstones.is_cancelled(delivery.message_id, now, delivery.due_ms)
