"""The worker's recurring hook without a broker: what it publishes before the handler,
and what it says for a plain message, a paused, removed or replaced chain, a publish that
fails, and an occurrence published long ago."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from rmqdelay.core.clock import ms_of_datetime, now_ms
from rmqdelay.core.journal.records import JournalRecord
from rmqdelay.core.journal.recurring import control_record
from rmqdelay.core.journal.rules import RECURRING, Occurrence, Rule
from rmqdelay.core.messages import ATTEMPT, DUE_AT
from rmqdelay.worker import Admission, Delivery
from rmqdelay.worker.recurring import RecurringHook, RecurringUnseen

pytestmark = pytest.mark.unit

RULE = Rule(every_ms=2000)


class Tail:
    def __init__(self) -> None:
        self.followers: list[Any] = []

    def follow(self, follower: Any) -> None:
        self.followers.append(follower)


@dataclass
class Message:
    body: bytes = b'{"tick":1}'
    content_type: str | None = "application/json"
    correlation_id: str | None = "c-1"


@dataclass
class Publisher:
    fails: bool = False
    sent: list[tuple[str, bytes, dict[str, Any]]] = field(default_factory=list)

    async def publish(self, destination: str, body: bytes, **options: Any) -> None:
        if self.fails:
            raise ConnectionError("gone")
        self.sent.append((destination, body, options))


def _hook() -> RecurringHook:
    tail = Tail()
    hook = RecurringHook(tail)  # type: ignore[arg-type]
    assert tail.followers == [hook]
    return hook


def _delivery(occurrence: Occurrence | None, extra: dict[str, Any] | None = None) -> Delivery:
    headers: dict[str, Any] = {ATTEMPT: 1, DUE_AT: 5, "user": "u", **(extra or {})}
    if occurrence is not None:
        headers |= occurrence.headers()
    return Delivery("ticks", "m-1", 1, 5, now_ms(), headers, False)


def _admit(
    hook: RecurringHook, delivery: Delivery, publisher: Publisher | None = None
) -> Admission | None:
    pending = hook.admit(delivery, Message(), publisher or Publisher())  # type: ignore[arg-type]
    if pending is None:
        return None

    async def wait() -> Admission:
        return await pending

    return asyncio.run(wait())


def test_a_plain_message_costs_nothing() -> None:
    assert _hook().admit(_delivery(None), Message(), Publisher()) is None  # type: ignore[arg-type]


def test_the_next_occurrence_is_published_before_the_handler() -> None:
    hook = _hook()
    occurrence = Occurrence("tick", 4000, RULE, "100-x", "active", 100)
    publisher = Publisher()
    admission = _admit(hook, _delivery(occurrence), publisher)
    assert admission is not None and admission.action == "handle"
    ((destination, body, options),) = publisher.sent
    assert (destination, body) == ("ticks", b'{"tick":1}')
    assert options["key"] == "recurring:tick@6000" and options["on_conflict"] == "ignore"
    assert options["message_id"] == "recurring:tick@6000:100-x"
    assert ms_of_datetime(options["at"]) == 6000
    headers = options["headers"]
    assert headers["user"] == "u" and DUE_AT not in headers and ATTEMPT not in headers
    assert headers[RECURRING] == "tick" and headers["rmqdelay-occurrence"] == 6000
    assert options["correlation_id"] == "c-1" and options["content_type"] == "application/json"


def test_paused_removed_and_replaced_chains() -> None:
    hook = _hook()
    occurrence = Occurrence("tick", 4000, RULE, "100-x", "active", 100)
    hook.add(control_record("tick", "add", 100, rule=RULE, chain="100-x", destination="ticks"))
    hook.add(control_record("tick", "pause", 200))
    publisher = Publisher()
    admission = _admit(hook, _delivery(occurrence), publisher)
    assert admission == Admission("drop", "recurring paused")
    assert publisher.sent[0][2]["headers"]["rmqdelay-recurring-state"] == "paused"

    hook.add(control_record("tick", "remove", 300))
    publisher = Publisher()
    assert _admit(hook, _delivery(occurrence), publisher) == Admission("drop", "recurring removed")
    assert publisher.sent == []  # the chain ends

    hook.add(control_record("tick", "add", 400, rule=RULE, chain="400-y", destination="ticks"))
    assert _admit(hook, _delivery(occurrence), publisher) == Admission("drop", "recurring replaced")
    assert publisher.sent == []


def test_a_publish_that_fails_gives_the_occurrence_back() -> None:
    occurrence = Occurrence("tick", 4000, RULE, "100-x")
    admission = _admit(_hook(), _delivery(occurrence), Publisher(fails=True))
    assert admission is not None and admission.action == "requeue"


def test_an_occurrence_published_long_ago_is_not_published_again() -> None:
    hook = _hook()
    long_ago = now_ms() - 3_600_000
    occurrence = Occurrence("tick", long_ago - long_ago % 2000, RULE, "100-x")
    following = occurrence.following("active", 0)
    hook.add(JournalRecord("scheduled", "n", "ticks", following.at_ms, headers=following.headers()))
    publisher = Publisher()
    assert _admit(hook, _delivery(occurrence), publisher) == Admission("handle")
    assert publisher.sent == []
    # a parked occurrence from long ago, replayed: the chain went on since, no fork
    older = Occurrence("tick", occurrence.at_ms - 20_000, RULE, "100-x")
    assert _admit(hook, _delivery(older), publisher) == Admission("handle")
    assert publisher.sent == []
    # the chain's last occurrence, late after a long stop: the next one goes out (catch-up)
    latest = following
    assert _admit(hook, _delivery(latest), publisher) == Admission("handle")
    assert [options["key"] for _, _, options in publisher.sent] == [
        f"recurring:tick@{latest.at_ms + 2000}"
    ]


def test_broken_chain_headers_are_handled_as_a_plain_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hook = _hook()
    broken = _delivery(None, {RECURRING: "tick", "rmqdelay-occurrence": "soon"})
    with caplog.at_level(logging.WARNING, "rmqdelay.worker"):
        assert hook.admit(broken, Message(), Publisher()) is None  # type: ignore[arg-type]
        assert hook.admit(broken, Message(), Publisher()) is None  # type: ignore[arg-type]
    assert len([r for r in caplog.records if "plain message" in r.getMessage()]) == 1


def test_a_worker_without_the_journal_says_the_chain_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unseen = RecurringUnseen()
    delivery = _delivery(Occurrence("tick", 4000, RULE, "100-x"))
    with caplog.at_level(logging.WARNING, "rmqdelay.worker"):
        assert unseen.before_handle(delivery) is False
        assert unseen.before_handle(delivery) is False
    assert len([r for r in caplog.records if "chain ends" in r.getMessage()]) == 1
    assert unseen.before_handle(_delivery(None)) is False
