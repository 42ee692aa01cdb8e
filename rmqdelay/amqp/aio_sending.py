"""How rmqdelay's asyncio side puts a message on the wire: :func:`send_encoded` (one
message, mandatory, confirmed; the publisher, the worker's settling and the bridge's
outbox), and :class:`JournalLinger`, several publishes' journal writes in one stream
message.

A service publishing one message at a time pays the broker one stream write per
publish for its journal record, about 270 µs of broker CPU on this kind of machine,
more than a third of what a plain queue costs it per message, and each worker's
journal tail pays about as much again to read it. A publish's record that comes within
``journal_linger`` of the last write waits here for the rest of it, with the records of
the publishes that follow, then they go as one write
(:func:`~rmqdelay.core.publishing.outgoing.merged_write`),
and each publish returns once that write is confirmed, as before: at least once, and a
write that fails fails every publish it recorded. The messages themselves do not wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel
from pamqp.commands import Basic

from ..core.journal.records import RECORDS_PER_WRITE
from ..core.publishing.outgoing import Outcome, Prepared, merged_write

__all__ = ["BYTES_PER_MERGED_WRITE", "EncodedProperties", "JournalLinger", "send_encoded"]


class EncodedProperties(Basic.Properties):
    """pamqp's properties object sending the bytes rmqdelay encoded (:mod:`..core.wire`).

    ``message_id`` stays an attribute: aiormq matches a basic.return to its publish by it.
    """

    def __init__(self, encoded: bytes, message_id: str) -> None:
        super().__init__(message_id=message_id)
        self._encoded = encoded

    def marshal(self) -> bytes:
        return self._encoded


async def send_encoded(
    channel: AbstractChannel,
    body: bytes,
    properties: EncodedProperties,
    *,
    exchange: str,
    routing_key: str,
    timeout: float,
) -> None:
    """basic.publish, mandatory, on a confirm channel; wait for the confirm or raise.

    aio-pika's own transport, without a Message and Exchange object per publish.
    """
    underlay = await channel.get_underlay_channel()
    await underlay.basic_publish(
        body,
        exchange=exchange,
        routing_key=routing_key,
        properties=properties,
        mandatory=True,
        timeout=timeout,
        **_NO_DRAIN,
    )


def _no_drain() -> dict[str, Any]:
    """``wait=False`` where aiormq has it: do not wait for each frame to be flushed.

    The confirm is still awaited (it cannot come before the bytes went out), and the
    window bounds what sits in the write buffer. Waiting for every flush cost about 13 %
    of the client CPU per message (bench/README.md, "What limits the figures").
    """
    params = inspect.signature(aiormq.Channel.basic_publish).parameters
    return {"wait": False} if "wait" in params else {}


_NO_DRAIN = _no_drain()


BYTES_PER_MERGED_WRITE = 1 << 20
"""Records kept with their bodies can be large: several writes merge up to this many
bytes (one write bigger goes alone, as before), far under any broker's message limit
(16 MiB by default since RabbitMQ 4.0)."""
_IN_TURN_S = 0.001
"""A publish this soon after the last one returned is taken to be its caller's next."""

Send = Callable[[Sequence[Prepared]], Awaitable[list[Outcome]]]


class JournalLinger:
    """At most one journal write per ``linger_s``: a record that comes sooner after the
    last write waits for the rest of that time, and goes with every record that came
    meanwhile as one write (at most ``RECORDS_PER_WRITE`` records: a full one goes at
    once). A record after a quiet ``linger_s`` goes at once, so a service publishing now
    and then waits for no one, and one publishing many a second pays about one stream
    write per ``linger_s``: every write is read back by each worker's journal tail, and a
    read costs the broker about what the write did.

    A caller awaiting each publish in turn gets no company in the linger: its next record
    cannot come before this publish returns. Such a publish (it began within
    ``_IN_TURN_S`` of the last one's return, none other in flight) sends what is pending
    once its messages are done, so it waits for their confirm, not for the linger:
    1.4 ms a publish against 1.1 without a linger, and 6.6 with a 5 ms linger waited out
    (300 publishes in turn, RabbitMQ 3.10, this machine).
    """

    def __init__(self, linger_s: float, send: Send) -> None:
        self.linger_s = linger_s
        self._send = send
        self._writes: list[Prepared] = []
        self._waiting: list[asyncio.Future[Outcome]] = []
        self._records = self._bytes = 0
        self._publishing = 0
        self._returned_at = float("-inf")
        self._sent_at = float("-inf")
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Future[None]] = set()

    def add(self, write: Prepared) -> asyncio.Future[Outcome]:
        """Queue ``write`` (not a :func:`~rmqdelay.core.publishing.outgoing.lone_write`)
        with the others pending; its outcome (an exception as a value), to await shielded:
        a cancelled caller's record still goes."""
        if (
            self._records + write.journal_records > RECORDS_PER_WRITE
            or self._bytes + len(write.body) > BYTES_PER_MERGED_WRITE
        ):
            self.flush()
        loop = asyncio.get_running_loop()
        outcome: asyncio.Future[Outcome] = loop.create_future()
        self._writes.append(write)
        self._waiting.append(outcome)
        self._records += write.journal_records
        self._bytes += len(write.body)
        if self._records >= RECORDS_PER_WRITE:
            self.flush()
        elif self._timer is None:
            wait = self._sent_at + self.linger_s - loop.time()
            self._timer = loop.call_later(max(0.0, wait), self.flush)
        return outcome

    @contextlib.contextmanager
    def publishing(self) -> Iterator[None]:
        """Around a publish's messages (:meth:`returned` once it has its outcome)."""
        loop = asyncio.get_running_loop()
        in_turn = not self._publishing and loop.time() - self._returned_at < _IN_TURN_S
        self._publishing += 1
        try:
            yield
        finally:
            self._publishing -= 1
            if in_turn and not self._publishing:
                self.flush()

    def returned(self) -> None:
        """A publish got its outcome: its caller may publish again at once."""
        self._returned_at = asyncio.get_running_loop().time()

    def flush(self) -> None:
        """Send what is pending now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        writes, waiting = self._writes, self._waiting
        self._writes, self._waiting, self._records, self._bytes = [], [], 0, 0
        if writes:
            self._sent_at = asyncio.get_running_loop().time()
            sending = asyncio.ensure_future(self._send_merged(writes, waiting))
            self._sending.add(sending)
            sending.add_done_callback(self._sending.discard)

    async def _send_merged(
        self, writes: list[Prepared], waiting: list[asyncio.Future[Outcome]]
    ) -> None:
        outcome: Outcome
        try:
            [outcome] = await self._send([merged_write(writes)])
        except BaseException as exc:  # a bug of ours, or cancelled: never leave one waiting
            outcome = exc
            raise
        finally:
            for future in waiting:
                if not future.done():
                    future.set_result(outcome)

    async def close(self) -> None:
        """Send what is pending and wait until it is confirmed (or failed)."""
        self.flush()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._sending)
