"""The step protocol: what a publish flow asks of the adapter that runs it.

A flow is a generator that yields the only things needing a broker, :class:`CheckQueue`
and :class:`CheckExchange` (passive checks), :class:`Send` (send and wait for confirms),
:class:`Failover` (move to another node) and :class:`Checkpoint` (write one, on the
side), and gets their answers back. Keeping the protocol apart from the flows lets an
adapter (pika, aio-pika, the in-memory stub) depend on it alone.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

from .journal.checkpoint import Mark
from .journal.steps import Append, Read
from .publishing.outgoing import Prepared

__all__ = [
    "RECONNECT_PAUSES",
    "CheckExchange",
    "CheckQueue",
    "Checkpoint",
    "Failover",
    "Flow",
    "Send",
    "Step",
    "Steps",
    "run_flow",
]

T = TypeVar("T")

RECONNECT_PAUSES = (0.0, 0.5, 2.0)
"""Seconds to wait before each attempt to reopen a dropped connection: three attempts."""


@dataclass(frozen=True)
class CheckQueue:
    """A step: does this work queue exist? Answer True or False (a passive check)."""

    queue: str


@dataclass(frozen=True)
class CheckExchange:
    """A step: does this exchange exist? Answer True or False (a passive check; a refusal
    is False). A held destination's marker (:meth:`~rmqdelay.core.layout.Layout.held_marker`)."""

    exchange: str


@dataclass(frozen=True)
class Send:
    """A step: send these messages in this order; answer one :data:`Outcome` each."""

    batch: Sequence[Prepared]
    """Read in order as the messages go out: a batch's journal writes are made when
    first read (:class:`~rmqdelay.core.publishing.outgoing.WithRecords`)."""


@dataclass(frozen=True)
class Failover:
    """A step: confirms did not come (``reason``); leave this connection for another node.

    Answer True once a new connection is open (the node that failed is tried last), and
    the flow sends the unconfirmed messages again; False when the publisher cannot move
    (a connection it was given, or no node answered): the errors stand.
    """

    reason: str


@dataclass(frozen=True)
class Checkpoint:
    """A step: write a checkpoint of the journal, on the side. A publisher's adapter starts
    it on a thread and a connection of its own and answers at once (at a million pending
    it takes seconds, which the publish it follows must not wait for); closing the
    publisher waits for it. ``due``, given the checkpoint stream's last message when the
    writer starts, says whether one is still due (another process may have written it)."""

    writer: str
    due: Callable[[Mark | None], bool]


Step = CheckQueue | CheckExchange | Send | Failover | Append | Read | Checkpoint
"""What a flow asks of its adapter: a publish's steps, and the journal's
(:mod:`.journal_steps`), so a publisher carries out both alike."""
Flow = Generator[Step, Any, T]
"""A publish (or a journal call) as steps for an adapter to carry out; its return value
is the call's."""


class Steps(Generic[T]):
    """Walks a flow: ``next(answer)`` gives the next step, or None once it returned."""

    def __init__(self, flow: Flow[T]) -> None:
        self._flow = flow
        self.value: T | None = None

    def next(self, answer: object = None) -> Step | None:
        try:
            return self._flow.send(answer)
        except StopIteration as stop:
            self.value = stop.value
            return None


def run_flow(flow: Flow[T], do: Callable[[Step], object]) -> T:
    """Carry out a flow with a synchronous ``do`` (a step in, its answer out)."""
    steps = Steps(flow)
    step = steps.next()
    while step is not None:
        step = steps.next(do(step))
    return cast(T, steps.value)
