"""Every public publisher against the one declaration of the publisher API.

:mod:`rmqdelay.core.publishing.aio_api` declares each operation and option once; the
sync declaration is generated from it. A publisher that lacks an operation, or any
option of one (its name, kind or default), or that is sync where it should be awaited,
fails here; so does a generated file left out of date.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import unasync  # scripts/unasync.py, on pytest's pythonpath

from rmqdelay import AsyncPublisher, Publisher, Settings
from rmqdelay.core.journal.reschedule import RescheduleResult
from rmqdelay.core.publishing.aio_api import AbstractAsyncPublisher
from rmqdelay.core.publishing.api import AbstractPublisher
from rmqdelay.testing import AsyncInMemoryPublisher, InMemoryPublisher

DECLARED = sorted(
    name
    for name, member in vars(AbstractAsyncPublisher).items()
    if callable(member) and (not name.startswith("_") or name in ("__aenter__", "__aexit__"))
)
SYNC_NAMES = {"__aenter__": "__enter__", "__aexit__": "__exit__"}
PUBLISHERS: list[tuple[type, type]] = [
    (Publisher, AbstractPublisher),
    (InMemoryPublisher, AbstractPublisher),
    (AsyncPublisher, AbstractAsyncPublisher),
    (AsyncInMemoryPublisher, AbstractAsyncPublisher),
]


def _shape(function: Callable[..., Any]) -> list[tuple[str, object, object, object]]:
    """What a caller relies on: each parameter's name, kind, default and annotation."""
    return [
        (p.name, p.kind, p.default, p.annotation)
        for p in inspect.signature(function).parameters.values()
    ]


def _differences(publisher: type, declaration: type) -> list[str]:
    """How ``publisher`` falls short of ``declaration``: one line per difference."""
    awaited = declaration is AbstractAsyncPublisher
    found = []
    for async_name in DECLARED:
        name = async_name if awaited else SYNC_NAMES.get(async_name, async_name)
        declared = getattr(declaration, name)
        given = getattr(publisher, name, None)
        if not callable(given):
            found.append(f"{publisher.__name__} lacks {name}")
            continue
        if inspect.iscoroutinefunction(given) != awaited:
            found.append(f"{publisher.__name__}.{name} is {'not ' if awaited else ''}awaited")
        if _shape(given) != _shape(declared):
            found.append(f"{publisher.__name__}.{name}{inspect.signature(given)}")
        if (
            inspect.signature(given).return_annotation
            != inspect.signature(declared).return_annotation
        ):
            found.append(f"{publisher.__name__}.{name} returns another type")
    return found


def test_the_declaration_covers_every_operation() -> None:
    operations = {
        "publish", "publish_many", "check_destination", "cancel", "reschedule",
        "list_scheduled", "add_recurring", "pause_recurring", "resume_recurring",
        "remove_recurring", "list_recurring", "connect", "close",
    }  # fmt: skip
    assert operations <= set(DECLARED)
    assert not inspect.isabstract(InMemoryPublisher) and not inspect.isabstract(Publisher)


def test_the_sync_declaration_is_generated_from_the_async_one() -> None:
    assert unasync.main(["--check"]) == 0, "run python scripts/unasync.py"
    assert _differences(AbstractPublisher, AbstractPublisher) == []
    for async_name in DECLARED:  # the same options, sync
        name = SYNC_NAMES.get(async_name, async_name)
        assert _shape(getattr(AbstractPublisher, name)) == _shape(
            getattr(AbstractAsyncPublisher, async_name)
        ), name
        assert getattr(AbstractPublisher, name).__doc__ == (
            getattr(AbstractAsyncPublisher, async_name).__doc__
        )


@pytest.mark.parametrize(("publisher", "declaration"), PUBLISHERS, ids=lambda c: c.__name__)
def test_every_publisher_has_every_operation_and_option(publisher: type, declaration: type) -> None:
    assert issubclass(publisher, declaration)
    assert _differences(publisher, declaration) == []


def test_a_publisher_short_of_an_option_or_an_operation_is_caught() -> None:
    class Drifted(InMemoryPublisher):
        def reschedule(  # type: ignore[override]
            self, id_or_key: str, *, delay: object = None
        ) -> RescheduleResult:
            raise NotImplementedError

        async def list_recurring(self) -> list[Any]:  # type: ignore[override]
            return []

    class Defaulted(InMemoryPublisher):
        def cancel(self, *message_ids: str, keys: Any = None) -> Any:
            raise NotImplementedError

    assert _differences(Drifted, AbstractPublisher) == [
        "Drifted.list_recurring is awaited",
        "Drifted.list_recurring returns another type",
        "Drifted.reschedule(self, id_or_key: 'str', *, delay: 'object' = None)"
        " -> 'RescheduleResult'",
    ]
    assert _differences(Defaulted, AbstractPublisher)[0].startswith("Defaulted.cancel(")
    assert _differences(type("Bare", (), {}), AbstractPublisher)[0] == "Bare lacks __enter__"


def test_every_option_works_in_memory_too() -> None:
    """The drift the declaration ends: ``progress=`` and ``advance()`` on a reschedule."""
    stub = InMemoryPublisher(Settings(max_delay="1d"))
    sent = stub.publish("orders", b"x", delay="1h", key="order-1", on_conflict="replace")
    counted: list[int] = []
    [listed] = stub.list_scheduled(progress=counted.append, key="order-1")
    assert listed.message_id == sent.message_id
    stub.advance("30m")
    result = stub.reschedule("order-1", delay="1h")
    assert result.outcome == "rescheduled"
    # an hour from the clock moved on: 1.5 h after the publish, not 1 h
    assert result.due_at_ms is not None
    assert result.due_at_ms - sent.due_at_ms >= 30 * 60_000
    at = datetime.now(timezone.utc) + timedelta(hours=2)
    assert stub.reschedule(sent.message_id, at=at).outcome == "rescheduled"


def test_the_async_in_memory_publisher_awaits_the_same_flows() -> None:
    async def scenario() -> list[str]:
        async with AsyncInMemoryPublisher(Settings(max_delay="1d")) as stub:
            added = await stub.add_recurring("tick", "orders", b"x", every="15m")
            paused = await stub.pause_recurring("tick")
            [schedule] = await stub.list_recurring()
            removed = await stub.remove_recurring("tick")
            return [added.outcome, paused.outcome, schedule.state, removed.outcome]

    assert asyncio.run(scenario()) == ["added", "paused", "paused", "removed"]
