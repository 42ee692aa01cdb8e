"""The admission step of worker hooks without a broker: the order hooks are asked in,
a hook with nothing to say, a drop that ends the asking, success steps gathered, and a
hook that fails (the message is handled: at least once)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from rmqdelay.worker import Admission, Delivery, Settled, WorkerHook
from rmqdelay.worker.hooks import HANDLE, Hooks
from rmqdelay.worker.logs import LogHook
from rmqdelay.worker.metrics import MetricsHook

NOW_MS = 1_800_000_000_000


def _delivery(message_id: str = "m-1") -> Delivery:
    return Delivery("jobs", message_id, 1, NOW_MS - 5, NOW_MS, {}, False)


class Says(WorkerHook):
    """Admits with a fixed answer (None: no say), recording that it was asked."""

    def __init__(self, name: str, calls: list[str], answer: Admission | None) -> None:
        self.name, self.calls, self.answer = name, calls, answer

    def admit(
        self, delivery: Delivery, message: Any, publisher: Any
    ) -> Awaitable[Admission] | None:
        self.calls.append(self.name)
        if self.answer is None:
            return None
        return self._later(self.answer)

    async def _later(self, answer: Admission) -> Admission:
        await asyncio.sleep(0)
        return answer


class Fails(WorkerHook):
    def admit(
        self, delivery: Delivery, message: Any, publisher: Any
    ) -> Awaitable[Admission] | None:
        return self._fail()

    async def _fail(self) -> Admission:
        raise RuntimeError("admit bug")


def _admit(hooks: Hooks) -> Admission:
    pending = hooks.admit(_delivery(), object(), object())  # type: ignore[arg-type]
    if pending is None:
        return HANDLE

    async def wait() -> Admission:
        assert pending is not None
        return await pending

    return asyncio.run(wait())


def test_no_admitting_hook_means_the_worker_does_not_ask() -> None:
    assert Hooks([MetricsHook(), LogHook()]).admitting == ()


def test_hooks_without_a_say_let_it_through_and_drop_ends_the_asking() -> None:
    calls: list[str] = []
    hooks = Hooks(
        [
            Says("a", calls, None),
            Says("b", calls, HANDLE),
            Says("c", calls, Admission("drop", "duplicate")),
            Says("d", calls, HANDLE),
        ]
    )
    assert _admit(hooks) == Admission("drop", "duplicate")
    assert calls == ["a", "b", "c"]


def test_success_steps_of_every_hook_are_gathered_in_order() -> None:
    async def first() -> None: ...

    async def second() -> None: ...

    calls: list[str] = []
    hooks = Hooks(
        [
            Says("a", calls, Admission("handle", on_success=(first,))),
            Says("b", calls, None),
            Says("c", calls, Admission("handle", on_success=(second,))),
        ]
    )
    assert _admit(hooks).on_success == (first, second)
    assert Hooks([Says("x", calls, None)]).admit(_delivery(), None, None) is None  # type: ignore[arg-type]


def test_a_failing_admission_handles_the_message(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []
    caplog.set_level(logging.ERROR, logger="rmqdelay.worker")
    hooks = Hooks([Fails(), Says("b", calls, HANDLE)])
    assert _admit(hooks) is HANDLE
    assert calls == ["b"]
    assert [r.getMessage() for r in caplog.records] == [
        "hook Fails failed in admit; the message is handled"
    ]


def test_drops_are_counted_by_reason_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    def sample(reason: str) -> float:
        value = REGISTRY.get_sample_value(
            "rmqdelay_key_drops_total", {"destination": "jobs", "reason": reason}
        )
        return value or 0.0

    before = sample("duplicate")
    caplog.set_level(logging.INFO, logger="rmqdelay.worker")
    hooks = Hooks([MetricsHook(), LogHook()])
    hooks.settled(_delivery(), Settled("dropped", "duplicate"))
    hooks.settled(_delivery(), Settled("forwarded", "rescheduled", delay_ms=1000))
    assert sample("duplicate") == before + 1
    said = [(r.getMessage(), getattr(r, "reason", None)) for r in caplog.records]
    assert said == [("dropped: duplicate", "duplicate"), ("forwarded: rescheduled", "rescheduled")]
