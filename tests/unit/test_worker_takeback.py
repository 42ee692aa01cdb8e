"""A redelivery settled with the outcome of a handling the broker took back: should that
settling fail too (the connection lost again), the outcome waits for the next redelivery
instead of the handler being called a second time (seen in CI: a consumer timeout, then a
lost connection while the retry copy was published). A retry copy whose session ends
under it is not the message's fault: it goes back to the broker, never to parking."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from rmqdelay.core.handling.retry import Decision
from rmqdelay.core.handling.takeback import key_of
from rmqdelay.worker.delivery import Delivery
from rmqdelay.worker.hooks import Hooks, Settled
from rmqdelay.worker.process import Outcome, Processor


class _Settler:
    def __init__(self, *results: str) -> None:
        self.results = list(results)
        self.decisions: list[Decision] = []

    async def settle(self, *args: Any) -> Settled:
        self.decisions.append(args[3])
        return Settled(self.results.pop(0))  # type: ignore[arg-type]


class _Session:
    def __init__(self, settler: _Settler) -> None:
        self.settler = settler

    def taken_back(self, _message: object) -> bool:
        return False


DELIVERY = Delivery("jobs", "m-1", 1, 1_000, 1_000, {}, True)
KEY = key_of("m-1", 1_000, 1)
RETRY: Outcome = (Decision("retry", 1, delay_ms=200, reason="boom"), None, 4.0)


async def _settle(processor: Processor, session: _Session) -> None:
    claim = processor.taken.claim(KEY, 0)
    assert claim == RETRY
    await processor._settle_as_first(
        cast(Any, session), cast(Any, None), cast(Any, None), DELIVERY, KEY, RETRY
    )


async def test_an_outcome_not_settled_waits_for_the_next_redelivery() -> None:
    processor = Processor(1, Hooks([]), asyncio.Event())
    processor.taken.took_back(KEY)
    processor.taken.finished(KEY, RETRY, 0)
    settler = _Settler("returned", "retried")
    await _settle(processor, _Session(settler))  # the connection went meanwhile
    await _settle(processor, _Session(settler))  # the next redelivery: the same outcome
    assert [d.action for d in settler.decisions] == ["retry", "retry"]
    assert processor.taken.claim(KEY, 0) == "handle"  # carried out once: forgotten


class _Message:
    consumer_tag = "ctag"


class _LostSession(_Session):
    """The connection goes while the handling's outcome is being settled."""

    def __init__(self, processor: Processor) -> None:
        super().__init__(_Settler("returned"))
        self.processor = processor
        self.gone = False
        settle = self.settler.settle

        async def losing(*args: Any) -> Settled:
            self.gone = True
            processor.on_taken_back(cast(Any, self), None, "connection lost")
            return await settle(*args)

        self.settler.settle = losing  # type: ignore[method-assign]

    def taken_back(self, _message: object) -> bool:
        return self.gone

    def queue_of(self, _spec: object) -> str:
        return "jobs.work"

    def cause(self, _message: object) -> str:
        return "connection lost"


async def test_a_handling_whose_settling_the_connection_cut_leaves_its_outcome() -> None:
    processor = Processor(1, Hooks([]), asyncio.Event())

    async def ran(*_args: Any) -> Outcome:
        return RETRY

    processor._run = ran  # type: ignore[method-assign,assignment]
    session = _LostSession(processor)
    await processor._handle(
        cast(Any, session), cast(Any, None), cast(Any, _Message()), DELIVERY, KEY
    )
    assert processor.taken.claim(KEY, 0) == RETRY  # for the redelivery, not a second call


class _Acks:
    def __init__(self) -> None:
        self.rejected: list[bool] = []

    def settled(self, _message: object) -> bool:
        return False

    async def reject(self, _message: object, *, requeue: bool) -> None:
        self.rejected.append(requeue)


class _FailingSession(_Session):
    """Settling raises what aiormq's drain raises when a channel closes under it."""

    def __init__(self, *, lost: bool) -> None:
        super().__init__(_Settler())
        self.lost = lost
        self.settler.acks = _Acks()  # type: ignore[attr-defined]

        async def failing(*args: Any) -> Settled:
            self.settler.decisions.append(args[3])
            raise Exception

        self.settler.settle = failing  # type: ignore[method-assign]

    def taken_back(self, _message: object) -> bool:
        return self.lost


async def test_a_redelivery_whose_settling_raises_keeps_the_outcome_and_is_requeued() -> None:
    """Seen in CI: the retry copy's publisher closed with the session, then the reject
    raised; the outcome was lost and the next redelivery called the handler again."""
    processor = Processor(1, Hooks([]), asyncio.Event())
    processor.taken.took_back(KEY)
    processor.taken.finished(KEY, RETRY, 0)
    session = _FailingSession(lost=False)
    await _settle(processor, session)  # does not raise
    assert [d.action for d in session.settler.decisions] == ["retry"]
    assert session.settler.acks.rejected == [True]  # type: ignore[attr-defined]
    assert processor.taken.claim(KEY, 0) == RETRY  # for the next redelivery


async def test_a_redelivery_on_a_session_that_is_ending_is_left_to_the_broker() -> None:
    """A session lost (its publisher closing) does not settle: a requeue there would come
    straight back to it, again and again, until its connection closed."""
    processor = Processor(1, Hooks([]), asyncio.Event())
    processor.taken.took_back(KEY)
    processor.taken.finished(KEY, RETRY, 0)
    session = _FailingSession(lost=True)
    await _settle(processor, session)
    assert session.settler.decisions == []
    assert session.settler.acks.rejected == []  # type: ignore[attr-defined]
    assert processor.taken.claim(KEY, 0) == RETRY


class _Publisher:
    """A publisher whose copy fails as ``error`` (the transport, not the API)."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    async def publish(self, *_args: Any, **_kwargs: Any) -> None:
        self.calls += 1
        raise self.error


class _Spec:
    destination = "jobs"


class _Body:
    body = b"{}"


async def _retry(error: Exception, *, closing: bool) -> tuple[Settled, _Acks, _Publisher]:
    from rmqdelay.worker.settle import Settler

    publisher, acks = _Publisher(error), _Acks()
    settler = Settler(cast(Any, publisher), cast(Any, None), 5.0, cast(Any, acks))
    settler.closing = closing
    decision = Decision("retry", 2, delay_ms=200, reason="boom")
    settled = await settler.settle(
        cast(Any, _Spec()), cast(Any, _Body()), DELIVERY, decision, None, 0.1
    )
    return settled, acks, publisher


async def test_a_retry_whose_session_ends_under_it_is_not_parked() -> None:
    """Seen in a CI run: a session ended while its retry copy was being published; what
    the publish raised then was not PublisherClosedError, and the message was parked."""
    from rmqdelay.errors import JournalError

    settled, acks, publisher = await _retry(JournalError("not confirmed"), closing=True)
    assert publisher.calls == 1
    assert settled.outcome == "returned" and "retry was not confirmed" in (settled.problem or "")
    assert acks.rejected == []  # left to the connection's close: a requeue would loop


async def test_a_retry_not_confirmed_goes_back_to_its_queue() -> None:
    from rmqdelay.errors import PublisherClosedError

    settled, acks, _ = await _retry(PublisherClosedError("gone"), closing=False)
    assert settled.outcome == "returned"
    assert acks.rejected == [True]
