"""The keys filter: a hook that lets a worker handle at most one copy per key and
generation, and moves the copies of a rescheduled message.

It folds the schedule journal into a :class:`~rmqdelay.core.journal.keys.KeyBook` (from the
cancel filter's tail: one reader per worker) and, before a handler runs, acts on the
book's verdict for the delivery:

- ``claim``: append a ``claimed`` record for the copy, wait until the tail has read it
  back, and ask again: the first claim in the journal's order wins, in every worker;
- ``handle``: this worker's claim came first (or the copy was redelivered and its
  claimer never wrote ``done``: taken over, at least once); after the handler returned,
  a ``done`` record is appended and confirmed, then the message is acked. While the
  handler runs, and until its ``done`` is read back, a redelivered copy of the same
  generation (a duplicate publish, as a recurring chain's restarted worker makes)
  waits here instead of taking the claim over;
- ``drop``: acked unhandled, counted in ``rmqdelay_key_drops_total`` by reason;
- ``forward``: an old copy of a message rescheduled later: published again due at the
  new time (confirmed), then acked;
- ``wait``: the delivery's own record is not read yet (it goes out in the same confirm
  window as the message, so it can trail by milliseconds): read on.

An unkeyed delivery costs one header lookup, unless the journal moved its id.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Mapping
from typing import Any, Literal

from aio_pika.abc import AbstractConnection, AbstractIncomingMessage

from ..amqp.aio_publisher import AsyncPublisher
from ..amqp.journal import JournalWriter
from ..core.clock import now_ms
from ..core.journal.generations import Generation
from ..core.journal.keys import KeyBook, Verdict
from ..core.journal.records import JournalRecord
from ..core.layout import Layout
from ..core.messages import KEY
from ..errors import JournalError
from .cancel import CancelFilter
from .delivery import Delivery
from .hooks import Admission, WorkerHook
from .metrics import KEYS_PENDING

__all__ = ["KEY", "KeyFilter", "KeysUnseen"]

log = logging.getLogger("rmqdelay.worker")

_KEYED = b'"key":'
_WAIT_POLL_S = 0.5
"""How often a delivery waiting for its record asks again without a record read."""
_MAX_CLAIMS = 3
"""Claims one delivery may write before it is given back (each was read back and the
verdict still asked for one: a fold that disagrees with itself)."""


def worker_instance() -> str:
    """This worker's name in its claims: host, process and a random part (a restarted
    process is another claimer)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class KeyFilter(WorkerHook):
    """Claims, drops and forwards keyed and moved copies by the journal's verdict."""

    def __init__(self, layout: Layout, confirm_timeout: float, cancels: CancelFilter) -> None:
        self.layout = layout
        self.timeout = confirm_timeout
        self.book = KeyBook()
        self.me = worker_instance()
        self._writer: JournalWriter | None = None
        self._claims: dict[str, asyncio.Future[None]] = {}
        """Claims written and not read back yet, by claim id."""
        self._heard: asyncio.Event | None = None
        """Set by the next record read, for deliveries waiting for theirs."""
        self._cancels = cancels
        self._here: dict[str, bool] = {}
        """Claims whose copy this worker handles, by claim id (whether its ``done`` was
        written): from the ``handle`` verdict until its handling ends without a ``done``,
        or its ``done`` is read back (a redelivered copy of the claim waits meanwhile)."""
        cancels.follow(self)
        book = self.book
        KEYS_PENDING.set_function(lambda: book.pending_keys(now_ms()))

    # ------------------------------------------------------------------ the fold

    def add(self, record: JournalRecord) -> None:
        self.book.add(record)
        if record.kind == "claimed" and record.claim_id in self._claims:
            claimed = self._claims.pop(record.claim_id)
            if not claimed.done():
                claimed.set_result(None)
        elif record.kind == "done" and self._here and record.worker == self.me:
            entry = self.book.by_id.get(record.message_id)
            claim = (
                entry.claim_for(record.due_at_ms, record.attempt)
                if isinstance(entry, Generation)
                else None
            )
            if claim is not None:
                self._here.pop(claim[1], None)  # the book says "duplicate" from now on
        heard = self._heard
        if heard is not None:
            self._heard = None
            heard.set()

    def wants(self, line: bytes) -> bool:
        """Keyed ``scheduled`` lines (the tombstones already take every other kind)."""
        return _KEYED in line

    def expire(self, now: int) -> int:
        return self.book.expire(now)

    def clear(self) -> None:
        self.book.clear()

    def restore(self, entry: Mapping[str, Any]) -> None:
        self.book.restore(entry)

    # ------------------------------------------------------------------ connection

    async def on_connect(self, connection: AbstractConnection, lost: asyncio.Event) -> None:
        """After the cancel filter (its tail has read the journal to its end)."""
        writer = JournalWriter(connection, self.layout, self.timeout)
        await writer.open()
        if writer.channel is not None:
            writer.channel.close_callbacks.add(lambda *_: lost.set())
        self._writer = writer

    async def on_disconnect(self) -> None:
        writer, self._writer = self._writer, None
        for claimed in self._claims.values():
            claimed.cancel()
        self._claims.clear()
        if writer is not None:
            await writer.close()

    # ------------------------------------------------------------------ admission

    def admit(
        self, delivery: Delivery, message: AbstractIncomingMessage, publisher: AsyncPublisher
    ) -> Awaitable[Admission] | None:
        key = delivery.headers.get(KEY)
        if key is None:
            moves = self.book.moves
            if not moves or delivery.message_id not in moves:
                return None  # the usual delivery: nothing to ask
            verdict = self._verdict(delivery, None, "")
            if verdict.action == "handle":
                return None
            return _now(_admission(verdict))
        return self._keyed(delivery, str(key))

    def _verdict(self, delivery: Delivery, key: str | None, claim_id: str) -> Verdict:
        redelivered = delivery.redelivered
        return self.book.verdict(
            delivery.message_id,
            delivery.due_ms,
            key,
            redelivered=redelivered,
            now_ms=now_ms(),
            claim_id=claim_id,
            held_here=self._here if redelivered and key is not None else (),
            attempt=delivery.attempt,
        )

    def _hold(self, verdict: Verdict, copy_ms: int, attempt: int) -> str:
        """Note the claim this handling (the current task) holds until it ends without a
        ``done``, or its ``done`` is read back; the claim's id (empty when there is none)."""
        generation = verdict.generation
        claim = generation.claim_for(copy_ms, attempt) if generation is not None else None
        task = asyncio.current_task()
        if claim is None or task is None:
            return ""
        held = claim[1]
        self._here[held] = False
        task.add_done_callback(lambda _task: self._ended(held))
        return held

    def _ended(self, held: str) -> None:
        if self._here.get(held) is False:  # no done written: the claim is free to take over
            del self._here[held]

    async def _keyed(self, delivery: Delivery, key: str) -> Admission:
        claim_id = ""
        claims = 0
        while True:
            verdict = self._verdict(delivery, key, claim_id)
            if verdict.action == "handle":
                copy_ms = self._copy_ms(delivery, verdict)
                held = self._hold(verdict, copy_ms, delivery.attempt)
                done = functools.partial(self._done, delivery, key, copy_ms, held)
                return Admission("handle", verdict.reason, on_success=(done,))
            if verdict.action == "claim":
                if claims >= _MAX_CLAIMS:
                    return Admission("requeue", "claimed, and the journal still asks for a claim")
                claims += 1
                claim_id = uuid.uuid4().hex
                try:
                    await self._claim(delivery, key, self._copy_ms(delivery, verdict), claim_id)
                except (JournalError, asyncio.TimeoutError) as exc:
                    log.warning(
                        "could not claim the keyed message (%s); it goes back to its queue",
                        exc,
                        extra={**delivery.fields, "key": key},
                    )
                    return Admission("requeue", "claim not read back")
                continue
            unrecorded = verdict.reason == "unrecorded"
            if unrecorded and self._out_of_reach(delivery):
                log.warning(
                    "a keyed message whose record may be older than the journal this worker "
                    "read: handled without a claim (at least once)",
                    extra={**delivery.fields, "key": key},
                )
                return Admission("handle", "record out of reach")
            if verdict.action == "wait":
                await self._next_record()
                continue
            return _admission(verdict)

    @staticmethod
    def _copy_ms(delivery: Delivery, verdict: Verdict) -> int:
        """The copy's due time, as the book keys its claims."""
        if delivery.due_ms is not None:
            return delivery.due_ms
        return verdict.generation.due_ms if verdict.generation is not None else 0

    def _out_of_reach(self, delivery: Delivery) -> bool:
        """Whether the delivery's record may be one this worker never read: its copy
        was due before what the checkpoint it began from still holds (settled records
        are left out), or, without a checkpoint, before it began reading the journal
        (written up to ``max_delay`` before, so before the tail's start). Dropping it as
        unrecorded could lose it."""
        due = delivery.due_ms
        return due is not None and due < self._cancels.reach_ms

    async def _next_record(self) -> None:
        if self._heard is None:
            self._heard = asyncio.Event()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._heard.wait(), _WAIT_POLL_S)

    async def _claim(self, delivery: Delivery, key: str, copy_ms: int, claim_id: str) -> None:
        """Append the claim and wait for the tail to read it back."""
        writer = self._writer
        if writer is None:
            raise JournalError("not connected")
        read_back = asyncio.get_running_loop().create_future()
        self._claims[claim_id] = read_back
        record = self._record("claimed", delivery, key, copy_ms, claim_id)
        try:
            await writer.write([record])
            await asyncio.wait_for(asyncio.shield(read_back), self.timeout)
        finally:
            self._claims.pop(claim_id, None)

    def _record(
        self,
        kind: Literal["claimed", "done"],
        delivery: Delivery,
        key: str,
        copy_ms: int,
        claim_id: str = "",
    ) -> JournalRecord:
        """This worker's ``claimed`` or ``done`` record of a delivery's copy."""
        return JournalRecord(
            kind,
            delivery.message_id,
            delivery.destination,
            copy_ms,
            delivery.attempt,
            recorded_at_ms=now_ms(),
            key=key,
            worker=self.me,
            claim_id=claim_id,
        )

    async def _done(self, delivery: Delivery, key: str, copy_ms: int, held: str) -> None:
        """The handler returned: every later copy of this generation is a duplicate."""
        writer = self._writer
        if writer is None:
            raise JournalError("not connected: no done record written")
        record = self._record("done", delivery, key, copy_ms)
        await writer.write([record])
        if held in self._here:  # not read back yet
            self._here[held] = True


def _admission(verdict: Verdict) -> Admission:
    if verdict.action == "forward":
        return Admission("forward", verdict.reason, forward_due_ms=verdict.forward_due_ms)
    if verdict.action == "drop":
        return Admission("drop", verdict.reason)
    return Admission("handle", verdict.reason)


async def _now(admission: Admission) -> Admission:
    return admission


class KeysUnseen(WorkerHook):
    """A worker without the journal cannot tell keyed copies apart: it handles each,
    and says so once."""

    def __init__(self) -> None:
        self.told = False

    def before_handle(self, delivery: Delivery) -> bool:
        if not self.told and KEY in delivery.headers:
            self.told = True
            log.warning(
                "a keyed message reached a worker with the schedule journal off: every copy "
                "of a key is handled (keys need the journal; turn it on to have at most one "
                "per key)",
                extra={**delivery.fields, "key": delivery.headers[KEY]},
            )
        return False
