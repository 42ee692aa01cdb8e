"""The publish flow's failover, run in memory: what got no confirm in time, or lost its
connection, is sent again once after the adapter moved, and only then."""

from __future__ import annotations

import pytest

from rmqdelay import (
    BatchPublishError,
    ConfirmTimeoutError,
    PublisherClosedError,
    PublishNackedError,
    Settings,
    UnroutableError,
)
from rmqdelay.core.journal.steps import Read
from rmqdelay.core.publishing.outgoing import Outcome, Prepared, PublishResult
from rmqdelay.core.publishing.publisher import PublisherCore
from rmqdelay.core.steps import CheckExchange, CheckQueue, Failover, Send, Steps

DEST = "orders"


def _core(journal: bool) -> PublisherCore:
    return PublisherCore(Settings(schedule_journal=journal, max_delay="1h").layout)


def _confirm(prepared: Prepared, core: PublisherCore) -> PublishResult:
    return PublishResult.of(core.finalize(prepared))


def _run(
    core: PublisherCore, requests: list[dict[str, object]], first: list[Outcome | None], move: bool
) -> tuple[list[PublishResult] | BaseException, list[object]]:
    """Drive ``publish_many`` by hand: queues exist; the first Send's messages get
    ``first`` (None: confirmed), journal writes are confirmed, later Sends confirm all.
    Returns the flow's result (or what it raised) and every step it yielded."""
    steps = Steps(core.publish_many(requests))
    seen: list[object] = []
    sends = 0
    answer: object = None
    try:
        while (step := steps.next(answer)) is not None:
            seen.append(step)
            if isinstance(step, CheckQueue):
                answer = True
            elif isinstance(step, CheckExchange):  # no destination is held here
                answer = False
            elif isinstance(step, Failover):
                answer = move
            elif isinstance(step, Read):  # is a checkpoint due? no checkpoint stream here
                answer = "missing"
            else:
                assert isinstance(step, Send)
                outcomes: list[Outcome] = []
                for i, prepared in enumerate(step.batch):
                    wanted = first[i] if sends == 0 and i < len(first) else None
                    outcomes.append(wanted or _confirm(prepared, core))
                sends += 1
                answer = outcomes
    except BaseException as exc:  # the flow raises what it would raise to a caller
        return exc, seen
    assert steps.value is not None
    return steps.value, seen


@pytest.mark.parametrize("journal", [False, True])
def test_unconfirmed_messages_are_sent_again_after_a_move(journal: bool) -> None:
    core = _core(journal)
    requests: list[dict[str, object]] = [
        {"destination": DEST, "body": f"m{i}".encode(), "delay": 10 + i} for i in range(4)
    ]
    first: list[Outcome | None] = [
        None,
        ConfirmTimeoutError("no confirm"),
        None,
        PublisherClosedError("closed"),
    ]
    result, seen = _run(core, requests, first, move=True)
    assert isinstance(result, list) and len(result) == 4
    failovers = [s for s in seen if isinstance(s, Failover)]
    assert len(failovers) == 1
    assert "2 of 4 unconfirmed (ConfirmTimeoutError, PublisherClosedError)" in failovers[0].reason
    sends = [s for s in seen if isinstance(s, Send)]
    again = [p for p in sends[1].batch if not p.journal_records]
    sent_first = [p for p in sends[0].batch if not p.journal_records]
    # the same messages, same ids and due times: copies, not new messages
    assert [(p.message_id, p.due_at_us) for p in again] == [
        (sent_first[1].message_id, sent_first[1].due_at_us),
        (sent_first[3].message_id, sent_first[3].due_at_us),
    ]
    # with the journal, the copies are recorded again beside them
    assert sum(p.journal_records for p in sends[1].batch) == (2 if journal else 0)


def test_a_publisher_that_cannot_move_keeps_the_errors() -> None:
    core = _core(False)
    requests: list[dict[str, object]] = [
        {"destination": DEST, "body": b"a", "delay": 1},
        {"destination": DEST, "body": b"b", "delay": 2},
    ]
    result, seen = _run(core, requests, [None, ConfirmTimeoutError("no confirm")], move=False)
    assert isinstance(result, BatchPublishError)
    assert [type(e) for e in result.failures.values()] == [ConfirmTimeoutError]
    assert len(result.results) == 1 and result.confirmed == 1  # the confirmed one, named
    assert sum(isinstance(s, Send) for s in seen) == 1


@pytest.mark.parametrize(
    "outcome", [None, PublishNackedError("nacked"), UnroutableError("returned")]
)
def test_no_failover_when_every_message_is_confirmed_or_refused(
    outcome: Outcome | None,
) -> None:
    """A nack or a return is the broker's answer: another node would answer the same."""
    core = _core(False)
    requests: list[dict[str, object]] = [{"destination": DEST, "body": b"a", "delay": 1}]
    result, seen = _run(core, requests, [outcome], move=True)
    assert not any(isinstance(s, Failover) for s in seen)
    assert isinstance(result, list) if outcome is None else isinstance(result, BatchPublishError)
