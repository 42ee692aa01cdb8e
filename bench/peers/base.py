"""The uniform interface every peer design implements, plus small shared helpers.

A *peer* is one way of delivering a message after a delay (or, for ``plain``, without one).
The runner drives every peer the same way::

    peer = SomePeer(...)
    await peer.setup()                  # declare objects / start processes, start consuming
    try:
        await peer.publish([("m1", 5000), ("m2", 1000)])   # returns once confirmed
        records = await peer.drain({"m1", "m2"}, timeout=15.0)
    finally:
        await peer.teardown()           # delete everything it created, even after errors

Rules every implementation follows:

* The constructor creates nothing outside the process (no connection, process, temp dir):
  ``name``/``description`` must be readable on an instance that was never set up.
* ``setup()`` starts the consumer, so arrivals are timestamped when they happen, not when
  ``drain()`` is called. Messages that arrive before ``drain()`` are buffered.
* ``publish()`` returns when the design's acknowledgement arrived for every message of the
  batch (publisher confirms for RabbitMQ, the command reply for Redis). It may be called
  concurrently from several tasks. ``published_at_ms`` is taken per message just before it
  is handed to the client library; ``due_at_ms = published_at_ms + delay_ms``.
* ``drain()`` waits until every expected id has arrived or ``timeout`` seconds passed, and
  returns the records of the expected ids that arrived, in arrival order. Missing ids are
  simply absent (the caller counts them).
* ``teardown()`` is idempotent, never raises, and deletes every queue, exchange, process
  and temp dir the peer created. Every broker object name starts with ``self.prefix``
  (``bench-<peer>-<hex>``), unique per instance.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from typing import Protocol, TypeVar, runtime_checkable

from bench.common import Record

#: One message to publish: (message_id, delay_ms).
Item = tuple[str, int]


@runtime_checkable
class Peer(Protocol):
    """A delay design under test. See the module docstring for the contract."""

    name: str
    """Short, unique, stable name used in tables and JSON (e.g. ``"naive"``)."""
    description: str
    """One honest paragraph: what was run, how, and what it is not."""
    supports_delay: bool
    """False for the reference peer that ignores delays (``plain``)."""

    async def setup(self) -> None: ...

    async def publish(self, batch: Sequence[Item]) -> None: ...

    async def drain(self, expected_ids: Collection[str], timeout: float) -> list[Record]: ...

    async def teardown(self) -> None: ...


def unique_prefix(peer_slug: str) -> str:
    """``bench-<peer>-<8 hex>``: the prefix for every object one peer instance creates."""
    return f"bench-{peer_slug}-{secrets.token_hex(4)}"


class Arrivals:
    """Buffer of delivered records, shared by the consumer side and ``drain()``."""

    def __init__(self) -> None:
        self._records: dict[str, Record] = {}
        self._changed = asyncio.Event()
        self.duplicates = 0

    def add(self, record: Record) -> None:
        if record.message_id in self._records:
            self.duplicates += 1
            return
        self._records[record.message_id] = record
        self._changed.set()

    def __len__(self) -> int:
        return len(self._records)

    def take_all(self) -> list[Record]:
        """Every buffered record, in arrival order, removing them (no waiting)."""
        got = sorted(self._records.values(), key=lambda r: r.received_at_ms)
        self._records.clear()
        return got

    async def wait_for(self, expected_ids: Collection[str], timeout: float) -> list[Record]:
        expected = set(expected_ids)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if expected.issubset(self._records.keys()):
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            await wait_event(self._changed, remaining)
        got = [self._records.pop(mid) for mid in list(self._records) if mid in expected]
        got.sort(key=lambda r: r.received_at_ms)  # stable: ties keep arrival order
        return got


async def wait_event(event: asyncio.Event, timeout: float) -> None:
    """Clear ``event``, then wait until it is set again or ``timeout`` seconds pass.

    Unlike ``asyncio.wait_for`` on Python 3.10/3.11, this never
    swallows a cancellation that races with the event being set.
    """
    event.clear()
    handle = asyncio.get_running_loop().call_later(max(0.0, timeout), event.set)
    try:
        await event.wait()
    finally:
        handle.cancel()


T = TypeVar("T")


async def run_windowed(
    send: Callable[[T], Awaitable[object]], items: Iterable[T], window: int
) -> None:
    """Run ``send(item)`` for every item with at most ``window`` in flight.

    Items are started in order (so they reach the wire in order), and the first failure is
    re-raised once everything in flight has finished.
    """
    sem = asyncio.Semaphore(window)
    errors: list[BaseException] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(item: T) -> None:
        try:
            await send(item)
        except BaseException as exc:  # collected and re-raised below
            errors.append(exc)
        finally:
            sem.release()

    for item in items:
        await sem.acquire()
        if errors:
            sem.release()
            break
        task = asyncio.create_task(one(item))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    if errors:
        raise errors[0]
