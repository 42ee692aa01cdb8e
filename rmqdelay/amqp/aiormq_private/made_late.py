"""The worker's acks on aiormq, made when aiormq's writer takes them
(:func:`queue_made_late`): a frame whose bytes are made as it leaves the connection's
private write queue. The package's
:func:`~rmqdelay.amqp.aiormq_private.can_queue_made_late` says where it may run;
elsewhere the worker acks through ``basic_ack``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiormq.abc import ChannelFrame

from .window import why_closed

__all__ = ["queue_made_late"]


class _MadeLate(ChannelFrame):
    """A frame whose bytes are made when aiormq's writer reads them (``payload``), once:
    what was asked for up to that moment goes in it. Written on a closed or closing
    channel, it is empty, and its drain future says why."""

    _underlay: Any
    _make: Callable[[], bytes]
    _made: bytes | None

    def __init__(
        self, underlay: Any, make: Callable[[], bytes], drain: asyncio.Future[Any]
    ) -> None:
        # a frozen dataclass: its fields are set as its own __init__ sets them
        object.__setattr__(self, "should_close", False)
        object.__setattr__(self, "drain_future", drain)
        object.__setattr__(self, "_underlay", underlay)
        object.__setattr__(self, "_make", make)
        object.__setattr__(self, "_made", None)

    @property
    def payload(self) -> bytes:
        made = self._made
        if made is None:  # read once by the writer; a debug log's repr reads it too
            reason = why_closed(self._underlay)
            drain: asyncio.Future[Any] = self.drain_future  # type: ignore[assignment]
            if reason is not None:
                made = b""
                if not drain.done():
                    drain.set_exception(reason)
            else:
                made = self._make()
            object.__setattr__(self, "_made", made)
        return made

    def __repr__(self) -> str:
        return f"<rmqdelay frame made late ({'made' if self._made is not None else 'queued'})>"


def queue_made_late(underlay: Any, make: Callable[[], bytes]) -> asyncio.Future[Any] | None:
    """Queue a frame for the connection's writer whose bytes ``make`` returns when the
    writer takes it; the future resolves once they are written, and fails when the
    channel closes first (it is in the channel's own store). None, and nothing queued,
    when the writer's queue is full or the channel is closed or closing.

    Why: the worker's acks went to aiormq as a task that ran on the loop's next turn and
    queued a ``basic.ack``, which the writer wrote a turn later. Queued at the first ack
    of a turn and made as it leaves, the frame goes a turn sooner and still carries every
    ack asked for until then (bench/README.md, the worker's drain).
    """
    if why_closed(underlay) is not None:
        return None
    drain: asyncio.Future[Any] = underlay.create_future()
    try:
        underlay.write_queue.put_nowait(_MadeLate(underlay, make, drain))
    except asyncio.QueueFull:
        drain.cancel()
        return None
    return drain
