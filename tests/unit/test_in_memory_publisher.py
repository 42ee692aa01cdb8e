"""The in-memory publisher runs the publishers' flows: each branch of them, with no broker.

What it records and raises is what :class:`~rmqdelay.Publisher` would (the same
:class:`~rmqdelay.core.publishing.publisher.PublisherCore`); these tests drive the flows'
branches through it: failover, a batch that partly fails, the journal on and off, a
message confirmed whose journal record was not.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from rmqdelay import (
    AsyncPublisher,
    AsyncPublisherProtocol,
    BatchPublishError,
    ConfigurationError,
    ConfirmTimeoutError,
    DelayError,
    Publisher,
    PublisherClosedError,
    PublisherProtocol,
    PublishError,
    PublishNackedError,
    Settings,
    TopologyError,
    UnknownDestinationError,
    UnroutableError,
)
from rmqdelay.core.messages import ATTEMPT, DESTINATION, DUE_AT
from rmqdelay.testing import AsyncInMemoryPublisher, InMemoryPublisher
from tests.helpers.readme_blocks import PYTHON_BLOCKS

DEST = "orders"


def _stub(**kwargs: object) -> InMemoryPublisher:
    journal = bool(kwargs.pop("journal", True))
    settings = Settings(schedule_journal=journal, max_delay="1d")
    return InMemoryPublisher(settings, **kwargs)  # type: ignore[arg-type]


def test_every_publisher_satisfies_its_protocol() -> None:
    # mypy checks these assignments; constructing a real publisher opens nothing
    sync: list[PublisherProtocol] = [InMemoryPublisher(), Publisher(Settings())]
    aio: list[AsyncPublisherProtocol] = [AsyncInMemoryPublisher(), AsyncPublisher(Settings())]
    assert len(sync) == len(aio) == 2


def test_a_publish_is_recorded_as_sent() -> None:
    stub = _stub()
    before = datetime.now(timezone.utc)
    result = stub.publish(DEST, {"order_id": 42}, delay="15m", headers={"tenant": "a"})
    after = datetime.now(timezone.utc)
    [sent] = stub.sent
    assert (sent.destination, sent.message_id) == (DEST, result.message_id)
    assert sent.json() == {"order_id": 42}
    assert sent.properties["content_type"] == "application/json"
    assert sent.headers["tenant"] == "a" and sent.headers[ATTEMPT] == 1
    assert sent.headers[DUE_AT] == sent.due_at_ms == result.due_at_ms
    assert sent.headers[DESTINATION] == DEST
    assert sent.due_at == result.due_at
    # due 15 minutes after the call, rounded up to the ms
    assert before + timedelta(minutes=15) <= sent.due_at
    assert sent.due_at <= after + timedelta(minutes=15, milliseconds=1)
    assert result.hops >= 1 and sent.routing_key == result.routing_key


def test_validation_is_the_publishers() -> None:
    stub = _stub()
    with pytest.raises(DelayError):
        stub.publish(DEST, b"x", delay="2d")  # over max_delay
    with pytest.raises(DelayError):
        stub.publish(DEST, b"x")  # neither delay nor at
    assert stub.sent == []


def test_an_unknown_destination_raises_before_sending() -> None:
    stub = _stub(destinations=[DEST])
    with pytest.raises(UnknownDestinationError, match="no work queue"):
        stub.publish("other", b"x", delay=0)
    with pytest.raises(UnknownDestinationError):
        stub.check_destination("other")
    stub.check_destination(DEST)
    stub.add_destination("other")
    stub.publish("other", b"x", delay=0)
    stub.remove_destination("other")
    with pytest.raises(UnknownDestinationError):
        stub.publish("other", b"x", delay=0)
    assert [s.destination for s in stub.sent] == ["other"]


@pytest.mark.parametrize(
    ("kind", "error"),
    [
        ("nack", PublishNackedError),
        ("return", UnroutableError),
        ("no exchange", UnroutableError),
    ],
)
def test_a_broker_refusal_is_raised_and_not_sent_again(kind: str, error: type) -> None:
    stub = _stub()
    stub.fail_next(kind)  # type: ignore[arg-type]
    with pytest.raises(error):
        stub.publish(DEST, b"x", delay="1s")
    assert stub.sent == [] and stub.failovers == []
    stub.publish(DEST, b"x", delay="1s")  # the failure was for the next message only
    assert len(stub.sent) == 1


@pytest.mark.parametrize(
    ("kind", "error"), [("timeout", ConfirmTimeoutError), ("lost", PublisherClosedError)]
)
def test_an_unconfirmed_message_is_sent_again_after_a_failover(kind: str, error: type) -> None:
    stub = _stub()
    stub.fail_next(kind)  # type: ignore[arg-type]
    result = stub.publish(DEST, b"x", delay="1s")
    assert [s.message_id for s in stub.sent] == [result.message_id]
    assert stub.failovers == [f"1 of 1 unconfirmed ({error.__name__})"]
    # the journal records the copy that was sent again (and the first, which may exist)
    assert [r.message_id for r in stub.journal] == [result.message_id] * 2


def test_without_a_failover_the_error_stands() -> None:
    stub = _stub(can_failover=False)
    stub.fail_next("timeout")
    with pytest.raises(ConfirmTimeoutError, match="confirm_timeout"):
        stub.publish(DEST, b"x", delay="1s")
    assert stub.sent == [] and len(stub.failovers) == 1


def test_a_failover_that_fails_again_raises() -> None:
    stub = _stub()
    stub.fail_next("lost", count=2)
    with pytest.raises(PublisherClosedError, match="publish it again"):
        stub.publish(DEST, b"x", delay="1s")
    assert len(stub.failovers) == 1  # once only


def test_a_partly_failed_batch_names_its_failures_and_keeps_the_rest() -> None:
    stub = _stub()
    requests = [{"destination": DEST, "body": {"n": n}, "delay": f"{10 - n}s"} for n in range(5)]
    stub.fail_next("nack", count=2, message_id=None)
    with pytest.raises(BatchPublishError) as caught:
        stub.publish_many(requests)
    batch = caught.value
    assert len(batch.failures) == 2 and len(batch.results) == 3
    assert all(isinstance(e, PublishNackedError) for e in batch.failures.values())
    # sent by due time: the two due first (n = 4, 3) were the ones nacked
    assert [s.json()["n"] for s in stub.sent] == [2, 1, 0]
    assert {r.message_id for r in batch.results} == {s.message_id for s in stub.sent}


def test_a_batch_keeps_the_order_of_its_requests() -> None:
    stub = _stub()
    requests = [{"destination": DEST, "body": {"n": n}, "delay": f"{10 - n}s"} for n in range(3)]
    results = stub.publish_many(requests)
    by_id = {s.message_id: s.json()["n"] for s in stub.sent}
    assert [by_id[r.message_id] for r in results] == [0, 1, 2]
    assert [s.json()["n"] for s in stub.sent] == [2, 1, 0]  # sent by due time


def test_a_message_confirmed_but_not_journaled_is_an_error_of_its_own() -> None:
    stub = _stub()
    stub.fail_next("nack", journal=True)
    with pytest.raises(PublishError, match="confirmed but its schedule journal record was not"):
        stub.publish(DEST, b"x", delay="1m")
    assert len(stub.sent) == 1 and stub.journal == []  # delivered, yet not listed
    assert stub.list_scheduled() == []


def test_with_the_journal_off_nothing_is_journaled_and_cancel_says_why() -> None:
    stub = _stub(journal=False)
    stub.publish(DEST, b"x", delay="1m")
    assert len(stub.sent) == 1 and stub.journal == []
    with pytest.raises(ConfigurationError, match="schedule journal, which is off"):
        stub.cancel("any")
    with pytest.raises(ConfigurationError):
        stub.list_scheduled()


def test_a_missing_journal_stream_raises_before_sending() -> None:
    stub = _stub(journal_exists=False)
    with pytest.raises(TopologyError, match="does not exist"):
        stub.publish(DEST, b"x", delay="1m")
    assert stub.sent == []


def test_cancel_and_list_read_the_journal() -> None:
    stub = _stub()
    soon = stub.publish(DEST, b"a", delay="1m")
    later = stub.publish(DEST, b"b", delay="2m", message_id="order-7")
    stub.publish("other", b"c", delay="3m")
    listed = stub.list_scheduled(destination=DEST)
    assert [r.message_id for r in listed] == [soon.message_id, "order-7"]
    [cancelled, unknown] = stub.cancel("order-7", "nobody")
    assert (cancelled.outcome, cancelled.due_at_ms) == ("cancelled", later.due_at_ms)
    assert unknown.outcome == "unknown"
    assert [r.message_id for r in stub.list_scheduled(destination=DEST)] == [soon.message_id]
    assert stub.list_scheduled(limit=1)[0].message_id == soon.message_id
    stub.advance("90s")
    assert [r.destination for r in stub.list_scheduled()] == ["other"]
    [late] = stub.cancel(soon.message_id)
    assert late.outcome == "too late"


def test_advancing_the_clock_moves_due_times() -> None:
    stub = _stub()
    stub.advance("1h")
    result = stub.publish(DEST, b"x", delay=0)
    assert result.due_at - datetime.now(timezone.utc) > timedelta(minutes=59)
    assert abs(stub.now() - result.due_at) < timedelta(seconds=1)


def test_a_dropped_connection_reconnects_or_raises() -> None:
    stub = _stub()
    stub.drop_connection()
    stub.publish(DEST, b"x", delay=0)
    assert stub.reconnects == 1
    stub.drop_connection(reconnects=False)
    with pytest.raises(PublisherClosedError, match="attempts to reconnect failed"):
        stub.publish(DEST, b"x", delay=0)
    assert len(stub.sent) == 1


def test_the_async_twin_runs_the_same_flows() -> None:
    async def scenario() -> None:
        async with AsyncInMemoryPublisher(Settings(max_delay="1d")) as stub:
            stub.fail_next("timeout")
            result = await stub.publish(DEST, b"x", delay="5s")
            [many] = await stub.publish_many([{"destination": DEST, "body": b"y", "delay": 1}])
            await stub.check_destination(DEST)
            assert [r.message_id for r in await stub.list_scheduled()] == [
                many.message_id,
                result.message_id,
            ]
            [answer] = await stub.cancel(result.message_id)
            assert answer.outcome == "cancelled" and len(stub.failovers) == 1

    asyncio.run(scenario())


def test_the_stub_imports_no_client_library() -> None:
    code = (
        "import sys, rmqdelay.testing; "
        "print([m for m in ('pika', 'aio_pika', 'aiormq', 'pamqp') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_docs_example_runs_without_a_broker() -> None:
    [block] = [b.code for b in PYTHON_BLOCKS if "InMemoryPublisher()" in b.code]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RMQDELAY_")}
    env["RMQDELAY_URL"] = "amqp://guest:guest@127.0.0.1:1/%2F"  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-c", block], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
