"""The sans-IO pieces: durations, settings, bodies, headers and the publisher core."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from rmqdelay import DelayError, InvalidBodyError, InvalidDestinationError, Settings, mask_url
from rmqdelay.core.durations import format_ms, parse_duration_us
from rmqdelay.core.messages import ATTEMPT, DESTINATION, DUE_AT, clean_headers, encode_body
from rmqdelay.core.publishing.outgoing import PublishResult, gather_results
from rmqdelay.core.publishing.publisher import PublisherCore
from rmqdelay.settings import SettingsError


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("1.5s", 1_500_000),
        ("15m", 900_000_000),
        ("2h30m", 9_000_000_000),
        ("250ms", 250_000),
        ("1d", 86_400_000_000),
        ("1w2d", 9 * 86_400_000_000),
        ("0.3", 300_000),
        (" 10 ms ", 10_000),
        ("-2s", -2_000_000),
    ],
)
def test_duration_strings(text: str, micros: int) -> None:
    assert parse_duration_us(text) == micros


def test_duration_numbers_are_exact_seconds() -> None:
    assert parse_duration_us(0.3) == 300_000  # not 300_000.00000000006 rounded up
    assert parse_duration_us(2) == 2_000_000
    assert parse_duration_us(timedelta(milliseconds=1, microseconds=5)) == 1005
    assert parse_duration_us(1e-7) == 1  # rounded up, never early


@given(
    st.floats(min_value=-1e12, max_value=1e12, allow_nan=False)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.floats(min_value=0, max_value=3600).map(lambda f: round(f, 7))
)
def test_float_seconds_are_read_from_their_shortest_form(seconds: float) -> None:
    assert parse_duration_us(seconds) == math.ceil(Fraction(repr(seconds)) * 1_000_000)


@pytest.mark.parametrize(
    "seconds",
    [0.0, -0.0, 1e-7, -1e-7, 5e-324, 0.0000005, -0.0000015, 123.4567891, -123.4567891, 1e16],
)
def test_float_seconds_at_their_edges(seconds: float) -> None:
    assert parse_duration_us(seconds) == math.ceil(Fraction(repr(seconds)) * 1_000_000)


@pytest.mark.parametrize("bad", ["", "soon", "5 parsecs", "1h 2x", "nan", "inf", math.nan, True])
def test_bad_durations_say_what_is_accepted(bad: object) -> None:
    with pytest.raises(DelayError):
        parse_duration_us(bad)  # type: ignore[arg-type]


@given(st.integers(0, 10**13))
def test_format_ms_parses_back(ms: int) -> None:
    assert parse_duration_us(format_ms(ms)) == ms * 1000


def test_format_ms_examples() -> None:
    assert format_ms(7680) == "7s680ms"
    assert format_ms(900_000) == "15m"
    assert format_ms(0) == "0ms"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"radix": 1}, "radix must be from 2 to 16"),
        ({"radix": 17}, "radix must be from 2 to 16"),
        ({"resolution": 0}, "resolution must be at least 1ms"),
        ({"resolution": "-10ms"}, "resolution must be at least 1ms"),
        ({"resolution": "1.5ms"}, "not a whole number of milliseconds"),
        ({"max_delay": "5000d"}, "10-year cap"),
        ({"named_tiers": ["3700d"], "max_delay": "1d"}, "10-year cap"),
        ({"named_tiers": ["15m5ms"]}, "multiple of the resolution"),
        ({"radix": 2, "resolution": "1ms", "max_destination_length": 200}, "over AMQP's 255"),
        ({"positions": 2, "max_delay": "1h"}, "needs more than positions=2"),
        ({"prefix": "amq.x"}, "must not start with 'amq.'"),
        ({"prefix": "a b"}, "words of letters"),
        ({"queue_type": "stream"}, "quorum"),
    ],
)
def test_settings_that_cannot_work_say_why(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings(**kwargs)


def test_default_settings_cover_a_year_and_mask_the_password() -> None:
    settings = Settings(url="amqps://app:hunter2@mq.example:5671/prod")
    assert settings.max_delay is None or settings.max_delay >= 365 * 86_400_000
    assert "hunter2" not in settings.masked_url and "***" in settings.masked_url
    assert "hunter2" not in repr(settings)
    assert mask_url("amqp://localhost/") == "amqp://localhost/"


def test_env_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RMQDELAY_PREFIX", "from-env")
    monkeypatch.setenv("RMQDELAY_NAMED_TIERS", '["15m"]')
    settings = Settings()
    assert settings.prefix == "from-env"
    assert settings.named_tiers == [900_000]
    assert Settings(prefix="from-flag").prefix == "from-flag"


class Order(BaseModel):
    order: int


def test_bodies_and_content_types() -> None:
    assert encode_body(b"\x00") == (b"\x00", "application/octet-stream")
    assert encode_body("hé") == ("hé".encode(), "text/plain; charset=utf-8")
    assert encode_body({"a": [1]}) == (b'{"a":[1]}', "application/json")
    assert encode_body(Order(order=3)) == (b'{"order":3}', "application/json")
    for bad in (object(), {"x": object()}, {"x": math.nan}, 3.5):
        with pytest.raises(InvalidBodyError):
            encode_body(bad)


def test_clean_headers_strips_dead_letter_records() -> None:
    headers = {
        "x-death": [{"count": 1}],
        "x-first-death-queue": "q",
        "x-last-death-reason": "expired",
        "x-custom": 1,
        ATTEMPT: 2,
    }
    assert clean_headers(headers) == {"x-custom": 1, ATTEMPT: 2}


def test_prepare_fixes_due_time_and_finalize_plans_what_is_left() -> None:
    core = PublisherCore(Settings(max_delay="1h").layout)
    prepared = core.prepare("orders", b"x", delay="5s", now=1_000_000_000)
    assert prepared.due_at_us == 1_005_000_000
    soon = core.finalize(prepared, now=1_000_000_000)
    later = core.finalize(prepared, now=1_004_000_000)  # waited 4 s in a batch
    assert soon.plan.units == 500 and later.plan.units == 100
    assert soon.headers[DUE_AT] == later.headers[DUE_AT] == 1_005_000
    assert soon.headers[DESTINATION] == "orders" and soon.headers[ATTEMPT] == 1
    overdue = core.finalize(prepared, now=2_000_000_000)
    assert overdue.exchange == "" and overdue.routing_key == "rmqdelay.work.orders"


def test_prepare_rejects_bad_input_before_sending() -> None:
    core = PublisherCore(Settings(max_delay="1h").layout)
    naive = datetime(2030, 1, 1)
    aware = datetime.now(timezone.utc) + timedelta(minutes=5)
    cases: list[tuple[dict[str, object], type[Exception], str]] = [
        ({"delay": -1}, DelayError, "must not be negative"),
        ({"delay": "2h"}, DelayError, "over the maximum of 1h"),
        ({"delay": math.inf}, DelayError, "finite"),
        ({"delay": 1, "at": aware}, DelayError, "not both"),
        ({}, DelayError, "give delay="),
        ({"at": naive}, DelayError, "naive"),
        ({"at": aware + timedelta(hours=2)}, DelayError, "over the maximum"),
        ({"delay": 1, "priority": 256}, ValueError, "priority must be an int from 0 to 255"),
        ({"delay": 1, "priority": True}, ValueError, "priority must be"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            core.prepare("orders", b"x", **kwargs)  # type: ignore[arg-type]
    for destination in ("", "a b", "a..b", "*", "x" * 101):
        with pytest.raises(InvalidDestinationError):
            core.prepare(destination, b"x", delay=1)
    past = core.prepare("orders", b"x", at=datetime(2000, 1, 1, tzinfo=timezone.utc))
    assert core.finalize(past).plan.units == 0


def test_prepare_keeps_message_id_and_strips_x_death() -> None:
    core = PublisherCore(Settings().layout)
    prepared = core.prepare(
        "orders",
        b"x",
        delay=1,
        message_id="m-1",
        headers={"x-death": [], ATTEMPT: 3},
        content_type="application/x-custom",
    )
    assert prepared.message_id == "m-1"
    assert prepared.headers == {ATTEMPT: 3}
    assert prepared.content_type == "application/x-custom"


@given(st.lists(st.integers(min_value=0, max_value=5), max_size=40))
def test_batches_go_out_by_due_time_and_results_come_back_in_order(dues: list[int]) -> None:
    core = PublisherCore(Settings().layout)
    batch = [
        core.prepare("orders", b"x", delay=d, message_id=f"m{i}", now=0) for i, d in enumerate(dues)
    ]
    order = core.send_order(batch)
    sent = [batch[i] for i in order]
    assert sorted(order) == list(range(len(batch)))
    # by due time, and in the caller's order where due times tie
    assert [(p.due_at_us, int(p.message_id[1:])) for p in sent] == sorted(
        (d * 1_000_000, i) for i, d in enumerate(dues)
    )
    outcomes = [PublishResult.of(core.finalize(p, now=0)) for p in sent]
    results = gather_results(batch, outcomes, order)
    assert [r.message_id for r in results] == [p.message_id for p in batch]


def test_header_values_become_plain_json_for_people() -> None:
    from decimal import Decimal

    from rmqdelay.core.messages import jsonable

    at = datetime(2026, 11, 29, 4, 0, tzinfo=timezone.utc)
    headers = {"b": b"caf\xc3\xa9\xff", "t": at, "n": [1, (2, Decimal("3.5"))], 7: None}
    shown = jsonable(headers)
    assert shown == {
        "b": "café\ufffd",
        "t": "2026-11-29T04:00:00+00:00",
        "n": [1, [2, "3.5"]],
        "7": None,
    }
    json.dumps(shown)  # what consume --json and the dashboard print
