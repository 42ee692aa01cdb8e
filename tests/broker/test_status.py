"""``rmqdelay status`` counts what was published, by either source, with no configure right."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pika

from rmqdelay import Publisher, Settings
from rmqdelay.core.plan import plan_delay
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.cli import invoke, settings_env
from tests.helpers.worker_helpers import make_settings

DEST = "counted"


def _publish_known_mix(settings: Settings) -> dict[str, int]:
    """3 at 5 min, 2 at 2 min, 2 due now (ready), 1 parked; the expected tier counts."""
    with Publisher(settings) as publisher:
        publisher.publish_many(
            [{"destination": DEST, "body": b"x", "delay": "5m"} for _ in range(3)]
            + [{"destination": DEST, "body": b"x", "delay": "2m"} for _ in range(2)]
            + [{"destination": DEST, "body": b"x", "delay": 0} for _ in range(2)]
        )
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish(settings.layout.parking, "", b"p", mandatory=True)
    finally:
        connection.close()
    expected: dict[str, int] = {}
    # first tiers that hold a message over a minute: the counts cannot move while the
    # test reads them, however busy the machine
    for delay_us, n in ((300_000_000, 3), (120_000_000, 2)):
        first = plan_delay(settings.layout, delay_us, DEST).hops[0].queue
        expected[first] = expected.get(first, 0) + n
    return expected


def _status(settings: Settings, *extra: str, url: str | None = None) -> dict[str, Any]:
    env = settings_env(settings, url=url or settings.url.get_secret_value())
    result = invoke(env, "status", "--json", *extra)
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.output)
    return data


def _check(data: dict[str, Any], expected: dict[str, int]) -> None:
    tiers = {t["queue"]: t["messages"] for t in data["tiers"] if t["messages"]}
    assert tiers == expected
    assert data["scheduled"] == 5
    [row] = [d for d in data["destinations"] if d["destination"] == DEST]
    assert row["ready"] == 2
    assert data["parked"] == 1
    assert data["journal"]["oldest_ms"] is not None
    # a stream's size is known to the management API only: AMQP reports 0 whatever it holds
    if data["source"] == "AMQP":
        assert data["journal"]["records"] is None
    else:
        assert data["journal"]["records"] >= 1
    assert data["missing"] == []


def test_status_counts_what_was_published_by_either_source(amqp_url: str, prefix: str) -> None:
    settings = make_settings(amqp_url, prefix, [DEST], max_delay="10m")
    expected = _publish_known_mix(settings)
    amqp = _status(settings, "--amqp-only", "-d", DEST)
    assert amqp["source"] == "AMQP"
    _check(amqp, expected)
    # the management API's counts lag by its statistics interval (5 s by default)
    deadline = time.monotonic() + 20
    while True:
        api = _status(settings)
        try:  # a passing HTTP error falls back to AMQP: ask again
            assert api["source"] == "management API"
            _check(api, expected)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    prometheus = invoke(settings_env(settings), "status", "--prometheus", "--amqp-only", "-d", DEST)
    assert f'rmqdelay_parked_messages{{prefix="{prefix}"}} 1' in prometheus.output
    assert f'destination="{DEST}",state="ready"}} 2' in prometheus.output


def test_a_user_without_configure_permission_gets_a_status(
    amqp_url: str, prefix: str, admin: BrokerAdmin
) -> None:
    settings = make_settings(amqp_url, prefix, [DEST], max_delay="10m")
    expected = _publish_known_mix(settings)
    user = f"{prefix}-reader"
    admin.add_user(user, "pw-status", configure="", write="", read=".*")
    try:
        parts = urlsplit(str(amqp_url))
        netloc = f"{quote(user)}:pw-status@{parts.hostname}:{parts.port or 5672}"
        limited = urlunsplit(parts._replace(netloc=netloc))
        data = _status(settings, "-d", DEST, url=limited)
    finally:
        admin.delete_user(user)
    assert data["source"] == "AMQP"  # no management tag: the API refuses it
    _check(data, expected)
