"""The worker's pure parts: backoff, the outcome decision, decoding, parked headers, logs."""

from __future__ import annotations

import functools
import json
import logging
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from typing_extensions import TypedDict

from rmqdelay import ConfigurationError, Settings
from rmqdelay.cli.worker import AppLoadError, _queues, load_worker
from rmqdelay.core.handling.handlers import inspect_handler
from rmqdelay.core.handling.parking import (
    PARKED_ATTEMPTS,
    PARKED_REASON,
    REPLAYS,
    parked_headers,
    read_parked,
    replay_headers,
    short_traceback,
)
from rmqdelay.core.handling.retry import (
    Backoff,
    DecodeError,
    Park,
    Requeue,
    Retry,
    RetryPolicy,
    decide,
)
from rmqdelay.core.messages import ATTEMPT, DESTINATION, DUE_AT, clean_headers
from rmqdelay.core.publishing.publisher import PublisherCore
from rmqdelay.worker import Worker, WorkerError
from rmqdelay.worker.context import Context
from rmqdelay.worker.logs import StructuredFormatter

POLICY = RetryPolicy(max_attempts=3, backoff=Backoff.constant("2s"))

# --------------------------------------------------------------------------- backoff


def test_backoff_kinds() -> None:
    assert [Backoff.constant("30s").nominal_ms(n) for n in (1, 2, 9)] == [30_000] * 3
    exp = Backoff.exponential("1s", max="10s")
    assert [exp.nominal_ms(n) for n in range(1, 7)] == [1000, 2000, 4000, 8000, 10000, 10000]
    assert Backoff.exponential("100ms", factor=3).nominal_ms(3) == 900
    steps = Backoff.schedule(["1s", "1m", "10m"])
    assert [steps.nominal_ms(n) for n in (1, 2, 3, 4)] == [1000, 60_000, 600_000, 600_000]
    assert exp.longest_ms(5) == 8000 and exp.longest_ms(1) == 0
    assert Backoff.exponential("1s", max="1h").nominal_ms(10_000) == 3_600_000  # no overflow


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ConfigurationError, match="jitter must be from 0 to 1"):
        Backoff.constant("1s", jitter=1.5)
    with pytest.raises(ConfigurationError, match="factor must be at least 1"):
        Backoff.exponential("1s", factor=0.5)
    with pytest.raises(ConfigurationError, match="must not be negative"):
        Backoff.constant("-1s")
    with pytest.raises(ConfigurationError, match="at least one delay"):
        Backoff.schedule([])


@given(
    base_ms=st.integers(0, 100_000),
    attempt=st.integers(1, 60),
    jitter=st.floats(0, 1),
    rand=st.floats(0, 1, exclude_max=True),
)
def test_jitter_only_adds_time(base_ms: int, attempt: int, jitter: float, rand: float) -> None:
    backoff = Backoff.exponential(f"{base_ms}ms", max="1h", jitter=jitter)
    nominal = backoff.nominal_ms(attempt)
    delay = backoff.delay_ms(attempt, rand)
    assert nominal <= delay <= nominal + nominal * jitter
    assert delay <= backoff.longest_ms(attempt + 1)
    assert backoff.nominal_ms(attempt + 1) >= nominal


# --------------------------------------------------------------------------- decide


def test_decide_every_outcome() -> None:
    assert decide(None, 1, POLICY).action == "ack"
    retry = decide(ValueError("boom"), 1, POLICY)
    assert (retry.action, retry.attempt, retry.delay_ms) == ("retry", 2, 2000)
    assert retry.reason == "ValueError: boom"
    explicit = decide(Retry(delay="250ms", reason="busy"), 2, POLICY)
    assert (explicit.action, explicit.attempt, explicit.delay_ms) == ("retry", 3, 250)
    last = decide(ValueError("boom"), 3, POLICY)
    assert (
        last.action == "park" and last.reason == "gave up after 3 of 3 attempts: ValueError: boom"
    )
    assert decide(Retry(), 3, POLICY).reason == "gave up after 3 of 3 attempts: Retry"
    assert decide(Requeue(), 3, POLICY).action == "requeue"  # not counted by rmqdelay
    park = decide(Park("customer gone"), 1, POLICY)
    assert (park.action, park.reason) == ("park", "customer gone")
    bad = decide(DecodeError("body is not valid JSON"), 1, POLICY)
    assert bad.action == "park" and bad.reason == "undecodable body: body is not valid JSON"


def test_decide_retry_on_and_park_on() -> None:
    policy = RetryPolicy(3, Backoff.constant("1s"), retry_on=(OSError,), park_on=(PermissionError,))
    assert decide(ConnectionError("x"), 1, policy).action == "retry"
    denied = decide(PermissionError("no"), 1, policy)
    assert denied.action == "park" and denied.reason == "PermissionError: no (park_on)"
    other = decide(KeyError("k"), 1, policy)
    assert other.action == "park" and "not in the handler's retry_on" in other.reason


def test_policy_checks() -> None:
    with pytest.raises(ConfigurationError, match="max_attempts must be at least 1"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ConfigurationError, match=r"backoff must be a rmqdelay\.Backoff"):
        RetryPolicy(backoff="1s")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="retry_on must hold exception classes"):
        RetryPolicy(retry_on=("ValueError",))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- handlers


class Order(BaseModel):
    order_id: int


class Point(TypedDict):
    x: int


def spec_of(func: Any) -> Any:
    return inspect_handler("d", func, POLICY, context=Context)


def test_decoders_follow_the_annotation() -> None:
    def as_model(msg: Order) -> None: ...
    def as_dict(msg: dict[str, int]) -> None: ...
    def as_list(msg: list[int]) -> None: ...
    def as_typed(msg: Point) -> None: ...
    def as_str(msg: str) -> None: ...
    def as_bytes(msg: bytes) -> None: ...
    def as_any(msg): ...  # type: ignore[no-untyped-def]

    assert spec_of(as_model).decoder(b'{"order_id": 3}', None) == Order(order_id=3)
    assert spec_of(as_dict).decoder(b'{"a": 1}', "application/json") == {"a": 1}
    assert spec_of(as_list).decoder(b"[1, 2]", None) == [1, 2]
    assert spec_of(as_typed).decoder(b'{"x": 1}', None) == {"x": 1}
    assert spec_of(as_str).decoder("héllo".encode(), None) == "héllo"
    assert spec_of(as_bytes).decoder(b"\xff", None) == b"\xff"
    auto = spec_of(as_any).decoder
    assert auto(b'{"a": 1}', "application/json") == {"a": 1}
    assert auto(b"hi", "text/plain; charset=utf-8") == "hi"
    assert auto(b"\x00", "application/octet-stream") == b"\x00"


def test_decode_errors_say_what_is_wrong() -> None:
    def as_model(msg: Order) -> None: ...
    def as_str(msg: str) -> None: ...
    def as_dict(msg: dict[str, int]) -> None: ...

    with pytest.raises(DecodeError, match="body does not validate as Order: order_id: Field"):
        spec_of(as_model).decoder(b"{}", None)
    with pytest.raises(DecodeError, match="body does not validate as Order: body: Invalid JSON"):
        spec_of(as_model).decoder(b"not json", None)
    with pytest.raises(DecodeError, match="body is not UTF-8 text"):
        spec_of(as_str).decoder(b"\xff\xfe", None)
    with pytest.raises(DecodeError, match=r"validate as dict\[str, int\]: a: Input should be"):
        spec_of(as_dict).decoder(b'{"a": "x"}', None)


def test_signatures() -> None:
    async def with_ctx(msg: bytes, ctx: Context) -> None: ...
    def without_ctx(msg: bytes) -> None: ...

    class AsyncCallable:
        async def __call__(self, msg: bytes) -> None: ...

    assert spec_of(with_ctx).is_async and spec_of(with_ctx).wants_context
    assert not spec_of(without_ctx).is_async and not spec_of(without_ctx).wants_context
    assert spec_of(functools.partial(with_ctx)).is_async
    assert spec_of(AsyncCallable()).is_async

    def nothing() -> None: ...
    def too_many(msg: bytes, ctx: Context, extra: int) -> None: ...
    def ctx_first(ctx: Context, msg: bytes) -> None: ...
    def gen(msg: bytes) -> Any:
        yield msg

    with pytest.raises(ConfigurationError, match="takes no message parameter"):
        spec_of(nothing)
    with pytest.raises(ConfigurationError, match=r"required parameters \['extra'\]"):
        spec_of(too_many)
    with pytest.raises(ConfigurationError, match="the first parameter is the message"):
        spec_of(ctx_first)
    with pytest.raises(ConfigurationError, match="must not be a generator"):
        spec_of(gen)


def test_worker_registration_and_selection() -> None:
    settings = Settings(prefix="p", max_delay="1m")
    app = Worker(settings)

    @app.handler("a")
    def a(msg: bytes) -> None: ...

    with pytest.raises(ConfigurationError, match="already has handler"):
        app.add_handler("a", a)
    with pytest.raises(WorkerError, match="no handler for queue 'b': this worker handles a"):
        app.select(settings, ["b"])
    assert [s.destination for s in app.select(settings, ["p.work.a"])] == ["a"]
    app.add_handler("slow", a, backoff=Backoff.constant("2m"))
    with pytest.raises(ConfigurationError, match="over max_delay=60000ms"):
        app.select(settings)
    app.handlers.pop("slow")
    app.add_handler("bad name", a)
    with pytest.raises(ConfigurationError, match="destination 'bad name' must be words"):
        app.select(settings, ["bad name"])
    with pytest.raises(WorkerError, match="no handlers"):
        Worker(settings).select(settings)


# --------------------------------------------------------------------------- parking


def test_parked_headers_and_replay() -> None:
    try:
        raise ValueError("card declined")
    except ValueError as exc:
        error = exc
    original = {"tenant": "acme", ATTEMPT: 5, DUE_AT: 1, DESTINATION: "orders", "x-death": [{}]}
    headers = parked_headers(
        original,
        reason="gave up",
        destination="orders",
        attempts=5,
        parked_at_ms=1_700_000_000_000,
        error=error,
        trace=short_traceback(error),
    )
    assert headers["tenant"] == "acme" and headers[PARKED_ATTEMPTS] == 5
    assert headers["rmqdelay-parked-error-type"] == "builtins.ValueError"
    assert 'raise ValueError("card declined")' in headers["rmqdelay-parked-traceback"]
    parked = read_parked(headers, "m1")
    assert (parked.reason, parked.attempts, parked.destination) == ("gave up", 5, "orders")
    assert parked.parked_at == datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)
    again = replay_headers({**headers, REPLAYS: 2, "x-delivery-count": 3})
    assert again == {"tenant": "acme", ATTEMPT: 1, REPLAYS: 3}
    long = parked_headers({}, reason="r" * 5000, destination="d", attempts=1, parked_at_ms=0)
    assert len(long[PARKED_REASON]) == 500


def test_read_parked_explains_what_the_broker_parked() -> None:
    layout = Settings(prefix="p", max_delay="1m").layout
    limit = {
        DESTINATION: "orders",
        ATTEMPT: 1,
        "x-death": [{"queue": "p.work.orders", "reason": "delivery_limit", "count": 1}],
    }
    parked = read_parked(limit, "m", layout)
    assert (
        parked.reason == "delivery limit of work queue 'p.work.orders' reached (requeued too often)"
    )
    assert parked.destination == "orders"
    unroutable = {
        DESTINATION: "gone",
        "x-death": [{"queue": "p.tier.p0.1-10ms", "reason": "expired"}],
    }
    assert read_parked(unroutable, "m", layout).reason.startswith(
        "unroutable: no work queue was bound for destination 'gone'"
    )
    assert read_parked({}, None, layout).destination is None


# --------------------------------------------------------------------------- logs


def test_log_lines_are_structured_and_never_show_the_password() -> None:
    url = "amqp://app:s3cr%40t@rabbit:5672/%2F"
    record = logging.LogRecord(
        "rmqdelay.worker", logging.INFO, __file__, 1, "handled %s", ("x",), None
    )
    record.message_id, record.attempt, record.lateness_ms = "m-1", 2, 15
    record.reason = "cannot reach amqp://app:s3cr%40t@rabbit:5672/%2F or app:s3cr@t@rabbit"
    text = StructuredFormatter("text", url).format(record)
    assert "handled x message_id=m-1 attempt=2 lateness_ms=15" in text
    assert "s3cr" not in text and "***" in text
    doc = json.loads(StructuredFormatter("json", url).format(record))
    assert doc["message_id"] == "m-1" and doc["attempt"] == 2 and "s3cr" not in json.dumps(doc)


# --------------------------------------------------------------------------- loading


def test_load_worker_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tasks_ok.py").write_text(
        "from rmqdelay.worker import Worker\napp = Worker()\nother = 1\n"
    )
    (tmp_path / "tasks_broken.py").write_text("import not_a_module_anywhere\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert isinstance(load_worker("tasks_ok:app"), Worker)
    assert isinstance(load_worker("tasks_ok"), Worker)  # the only Worker in it
    with pytest.raises(AppLoadError, match="cannot import module 'nope'"):
        load_worker("nope:app")
    with pytest.raises(AppLoadError, match="importing module 'tasks_broken' failed"):
        load_worker("tasks_broken:app")
    with pytest.raises(AppLoadError, match="no attribute 'missing'; Worker objects in it: app"):
        load_worker("tasks_ok:missing")
    with pytest.raises(AppLoadError, match=r"tasks_ok:other is a int, not an rmqdelay\.Worker"):
        load_worker("tasks_ok:other")
    with pytest.raises(AppLoadError, match="give the worker as module:attr"):
        load_worker("tasks_ok:")
    for name in ("tasks_ok", "tasks_broken"):
        sys.modules.pop(name, None)


def test_queues_option() -> None:
    assert _queues(None) is None
    assert _queues("a, b") == ["a", "b"]
    with pytest.raises(WorkerError, match="bad --queues 'a,,b'"):
        _queues("a,,b")


def test_cleaned_headers_are_what_keeps_the_cycle_test_honest() -> None:
    """tests/broker/test_worker.py's cycle test relies on this stripping; keep the two in step."""
    headers = {"x-death": [{}], "x-first-death-queue": "q", "x-last-death-reason": "r", "k": 1}
    assert clean_headers(headers) == {"k": 1}


def test_a_170ms_retry_sent_10ms_late_takes_the_160ms_tier_alone() -> None:
    """Why the cycle test once failed under load: the due time is fixed when a send is
    prepared, and the tiers are planned for what is left of the delay when it goes out.
    Same due time either way; never early."""
    core = PublisherCore(Settings(max_delay="1h").layout)
    prepared = core.prepare("jobs", b"x", delay="170ms", now=1_000_000)
    on_time = core.finalize(prepared, now=1_000_000 + 9_999)
    late = core.finalize(prepared, now=1_000_000 + 10_000)
    assert [t.ttl_ms for t in on_time.plan.hops] == [160, 10]
    assert [t.ttl_ms for t in late.plan.hops] == [160]
    assert on_time.headers[DUE_AT] == late.headers[DUE_AT] == 1_170


def test_a_2870ms_retry_sent_up_to_160ms_late_still_dead_letters_into_the_160ms_tier() -> None:
    """Why the cycle test's sends take 2870 ms: a late send loses units of its last tier
    first, so tier 160 ms stays the one tier 2560 ms dead-letters into (the trap)."""
    core = PublisherCore(Settings(max_delay="1h").layout)
    prepared = core.prepare("jobs", b"x", delay="2870ms", now=1_000_000)
    hops_when_late_by_us = {
        0: [2560, 160, 150],
        9_999: [2560, 160, 150],
        10_000: [2560, 160, 140],
        159_999: [2560, 160],
        160_000: [2560, 150],  # past the test's room: tier 160 ms skipped
    }
    for lag_us, hops in hops_when_late_by_us.items():
        out = core.finalize(prepared, now=1_000_000 + lag_us)
        assert [t.ttl_ms for t in out.plan.hops] == hops, lag_us
        assert out.headers[DUE_AT] == 3_870
