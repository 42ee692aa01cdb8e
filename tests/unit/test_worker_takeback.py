"""A redelivery settled with the outcome of a handling the broker took back: should that
settling fail too (the connection lost again), the outcome waits for the next redelivery
instead of the handler being called a second time (seen in CI: a consumer timeout, then a
lost connection while the retry copy was published)."""

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
