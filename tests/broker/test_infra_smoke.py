"""Smoke tests of the test infrastructure on the broker: scripts/broker.py, the helpers,
fixtures.  The parts that need no broker are in tests/unit/test_infra_units.py."""

from __future__ import annotations

import re
import time
import urllib.parse
import uuid
import warnings
from types import ModuleType

import pika
import pytest
from broker import BrokerInfo
from brokers import container
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from tests.helpers.broker_fakes import FakeContainer
from tests.helpers.brokerctl import BrokerAdmin, delete_prefixed, release_prefix


def _url_for(amqp_url: str, user: str, password: str) -> str:
    parts = urllib.parse.urlsplit(amqp_url)
    host = parts.netloc.rpartition("@")[2]
    q = urllib.parse.quote
    return urllib.parse.urlunsplit(
        parts._replace(netloc=f"{q(user, safe='')}:{q(password, safe='')}@{host}")
    )


def _connect(url: str, name: str) -> pika.BlockingConnection:
    params = pika.URLParameters(url)
    params.client_properties = {"connection_name": name}
    params.connection_attempts = 1
    return pika.BlockingConnection(params)


def test_broker_fixture(broker: BrokerInfo, amqp_url: str, admin: BrokerAdmin) -> None:
    assert broker.source in ("env", "local", "testcontainers", "debian")
    assert amqp_url == broker.url and f"{amqp_url}" == broker.url
    password = urllib.parse.urlsplit(amqp_url).password
    if password:
        assert f":{password}@" not in repr(amqp_url)  # pytest tracebacks show repr()
    assert re.match(r"\d+\.\d+", admin.broker_version())
    if broker.management_url:
        assert "@" not in broker.management_url


@pytest.fixture(params=["api", "rabbitmqctl"])
def backend_admin(request: pytest.FixtureRequest, broker: BrokerInfo) -> BrokerAdmin:
    """A BrokerAdmin forced onto one backend (skipped where that one is unavailable)."""
    if request.param == "api":
        admin = BrokerAdmin(broker.url, broker.management_url)
        if not admin.uses_management_api:
            pytest.skip("the management API is not available")
        admin._connections_backend = "api"
    else:
        admin = BrokerAdmin(broker.url, None)
        if not admin.is_local_node:
            pytest.skip("rabbitmqctl does not administer this broker")
        try:
            admin.broker_version()
            admin.users()
        except Exception as exc:
            pytest.skip(f"rabbitmqctl unusable: {exc}")
    return admin


def test_declare_and_close_connection(
    prefix: str, amqp_url: str, backend_admin: BrokerAdmin
) -> None:
    admin = backend_admin
    conn = _connect(amqp_url, prefix)
    try:
        channel = conn.channel()
        channel.queue_declare(f"{prefix}.q", durable=True)
        assert f"{prefix}.q" in admin.queues()
        listed = admin.wait_for_connections(prefix)  # the API lists new ones late
        assert [c["connection_name"] for c in listed] == [prefix]
        assert listed[0]["user"] == urllib.parse.urlsplit(amqp_url).username

        t0 = time.monotonic()
        assert admin.close_connections(prefix) == 1
        print(f"close_connections took {time.monotonic() - t0:.1f}s")

        with pytest.raises(ConnectionClosedByBroker) as info:
            for _ in range(50):  # the client notices on its next read
                conn.process_data_events(time_limit=0.1)
        assert info.value.reply_code == 320  # CONNECTION_FORCED
        assert conn.is_closed
    finally:
        if conn.is_open:
            conn.close()
    assert not [c for c in admin.connections() if c["connection_name"] == prefix]
    assert admin.close_connections(prefix, expect=0) == 0


def test_user_without_configure_can_publish_not_declare(
    prefix: str, amqp_url: str, backend_admin: BrokerAdmin
) -> None:
    admin = backend_admin
    with _connect(amqp_url, f"{prefix}-admin") as conn:
        conn.channel().queue_declare(f"{prefix}.q")

    user, password = f"{prefix}-user", uuid.uuid4().hex
    admin.add_user(user, password, configure="^$", write=".*", read=".*", vhost=admin.vhost)
    with _connect(_url_for(amqp_url, user, password), f"{prefix}-limited") as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        channel.basic_publish("", f"{prefix}.q", b"hello", mandatory=True)  # raises if refused
        _, _, body = channel.basic_get(f"{prefix}.q", auto_ack=True)
        assert body == b"hello"

        with pytest.raises(ChannelClosedByBroker) as info:
            channel.queue_declare(f"{prefix}.other")
        assert info.value.reply_code == 403  # ACCESS_REFUSED
    assert user in admin.users()
    # the prefix fixture deletes the user (see the prefix cleanup test below)


def test_the_prefix_cleanup_removes_what_the_test_named_and_nothing_else(
    prefix: str, amqp_url: str, admin: BrokerAdmin
) -> None:
    with _connect(amqp_url, f"{prefix}-decl") as conn:
        channel = conn.channel()
        channel.queue_declare(f"{prefix}.q", durable=True)
        channel.exchange_declare(f"{prefix}.x", "direct", durable=True)
        channel.exchange_declare(prefix, "fanout")
        channel.queue_declare(f"{prefix}x.keep")  # not ours: "prefix" + "." is the rule
    admin.add_user(f"{prefix}-u", "pw-not-printed", ".*", ".*", ".*", vhost=admin.vhost)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a failed cleanup only warns: here it fails
            release_prefix(admin, prefix)  # what the prefix fixture runs after each test
        queues, exchanges, users = admin.queues(), admin.exchanges(), admin.users()
        assert f"{prefix}.q" not in queues
        assert f"{prefix}.x" not in exchanges and prefix not in exchanges
        assert f"{prefix}-u" not in users
        assert f"{prefix}x.keep" in queues  # outside the prefix: left alone
    finally:
        assert delete_prefixed(amqp_url, [f"{prefix}x.keep"], kind="queue") == 1
    assert f"{prefix}x.keep" not in admin.queues()


# --------------------------------------------------------------------------- broker.py sources


def test_testcontainers_source_lives_with_the_block(
    no_broker_here: ModuleType, broker: BrokerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    if broker.source == "testcontainers" or not broker.url.startswith("amqp://guest:guest@"):
        pytest.skip("the fake container points at a local guest/guest broker on 5672")
    monkeypatch.setattr(container, "docker_available", lambda: (True, "fake engine"))
    monkeypatch.setattr(container, "container_class", lambda: FakeContainer)
    FakeContainer.stopped.clear()
    with no_broker_here.ensure_broker() as info:
        assert info.source == "testcontainers"
        assert info.url == "amqp://guest:guest@127.0.0.1:5672/%2F"
        assert not FakeContainer.stopped
    assert FakeContainer.stopped == [True]
    # the CLI does not start a container that would die with it
    assert no_broker_here.main(["-q"]) == 0
