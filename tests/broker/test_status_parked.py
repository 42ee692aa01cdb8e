"""``status --parked-by-destination`` counts parked messages per destination and removes none;
the management listing is paged and filtered; an empty journal costs no wait."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pika
import pytest

from rmqdelay import Settings
from rmqdelay.amqp import status as amqp_status
from rmqdelay.amqp.passive import ready_messages
from rmqdelay.core.handling.parking import PARKED_DESTINATION, PARKED_REASON
from rmqdelay.core.messages import DESTINATION
from rmqdelay.core.routing import build_key
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.cli import invoke, settings_env
from tests.helpers.worker_helpers import make_settings

DEST = "orders"


def _park_a_known_mix(settings: Settings) -> None:
    """3 parked by a worker for DEST, 2 by the broker for a destination with no work
    queue (the delivery exchange's alternate exchange), 1 with no rmqdelay header."""
    layout = settings.layout
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        worker_parked = pika.BasicProperties(
            headers={PARKED_DESTINATION: DEST, PARKED_REASON: "gave up"}
        )
        for _ in range(3):
            channel.basic_publish(layout.parking, "", b"p", worker_parked, mandatory=True)
        due_now = build_key(layout, (0,) * len(layout.positions), "gone")
        unroutable = pika.BasicProperties(headers={DESTINATION: "gone"})
        for _ in range(2):
            channel.basic_publish(layout.delivery_exchange, due_now, b"g", unroutable, True)
        channel.basic_publish(layout.parking, "", b"?", mandatory=True)
    finally:
        connection.close()


def _parked_now(settings: Settings) -> int | None:
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        return ready_messages(connection, settings.layout.parking, 5.0)
    finally:
        connection.close()


def _status(settings: Settings, *extra: str, url: str | None = None) -> dict[str, Any]:
    env = settings_env(settings, url=url or settings.url.get_secret_value())
    result = invoke(env, "status", "--json", "--parked-by-destination", *extra)
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.output)
    return data


def _all_back(settings: Settings) -> None:
    """Every message the peek read is in the parking queue again (a requeue is quick,
    not instant, on a quorum queue)."""
    deadline = time.monotonic() + 10
    while _parked_now(settings) != 6:
        assert time.monotonic() < deadline, f"parking holds {_parked_now(settings)}, not 6"
        time.sleep(0.1)


@pytest.mark.parametrize("source", ["--amqp-only", "--management-or-amqp"])
def test_parked_messages_are_counted_per_destination_and_stay(
    amqp_url: str, prefix: str, source: str
) -> None:
    settings = make_settings(amqp_url, prefix, [DEST], max_delay="10m")
    _park_a_known_mix(settings)
    extra = ["--amqp-only"] if source == "--amqp-only" else []
    for _ in range(2):  # a second read finds them all again: the first removed none
        data = _status(settings, *extra)
        assert data["parked_by_destination"] == {
            "read": 6,
            "complete": True,
            "destinations": {DEST: 3, "gone": 2},
            "unknown": 1,
        }
        _all_back(settings)


def test_the_peek_reads_no_more_than_its_limit(amqp_url: str, prefix: str) -> None:
    settings = make_settings(amqp_url, prefix, [DEST], max_delay="10m")
    _park_a_known_mix(settings)
    breakdown = _status(settings, "--amqp-only", "--parked-limit", "2")["parked_by_destination"]
    assert breakdown["read"] == 2
    assert not breakdown["complete"]
    assert sum(breakdown["destinations"].values()) + breakdown["unknown"] == 2
    _all_back(settings)
    plain = invoke(
        settings_env(settings),
        *("status", "--amqp-only", "--parked-by-destination", "--parked-limit", "2"),
        terminal_width=200,
    )
    assert plain.exit_code == 0, plain.output
    assert "parked by destination (the first 2 read)" in plain.output


def test_a_user_who_may_only_read_gets_the_breakdown(
    amqp_url: str, prefix: str, admin: BrokerAdmin
) -> None:
    settings = make_settings(amqp_url, prefix, [DEST], max_delay="10m")
    _park_a_known_mix(settings)
    user = f"{prefix}-reader"
    admin.add_user(user, "pw-peek", configure="", write="", read=".*")
    try:
        parts = urlsplit(str(amqp_url))
        netloc = f"{quote(user)}:pw-peek@{parts.hostname}:{parts.port or 5672}"
        data = _status(settings, url=urlunsplit(parts._replace(netloc=netloc)))
    finally:
        admin.delete_user(user)
    assert data["parked_by_destination"]["destinations"] == {DEST: 3, "gone": 2}
    _all_back(settings)


def test_the_management_listing_pages_and_an_empty_journal_costs_no_wait(
    amqp_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings(amqp_url, prefix, [DEST], max_delay="10m")
    queues = len(settings.layout.tiers) + 3  # + the work queue, parking, the journal
    monkeypatch.setattr(amqp_status, "_PAGE_SIZE", 7)  # several pages of the real API
    assert queues > 2 * 7
    reads: list[str] = []
    read_oldest = amqp_status._oldest_record_ms

    def counted(given: Settings, stream: str) -> int | None:
        reads.append(stream)
        return read_oldest(given, stream)

    monkeypatch.setattr(amqp_status, "_oldest_record_ms", counted)
    status = amqp_status.gather_status(settings)
    assert status.source == "management API"
    assert status.missing == []  # every page was read
    assert [d.destination for d in status.destinations] == [DEST]
    assert status.journal is not None and status.journal.records == 0
    # reading the first record of an empty stream waits for its timeout: the API said 0
    assert reads == []
    assert status.journal.oldest_ms is None
    # over AMQP a stream always says 0, so the read is tried (and finds nothing)
    status = amqp_status.gather_status(settings, use_management=False)
    assert reads == [f"{prefix}.schedule"]
    assert status.journal is not None and status.journal.oldest_ms is None
