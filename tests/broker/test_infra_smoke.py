"""Smoke tests of the test infrastructure: scripts/broker.py, tests/brokerctl.py, fixtures."""

from __future__ import annotations

import re
import time
import urllib.parse
import uuid
from typing import Any

import pika
import pytest
from broker import BrokerInfo, mask_url
from brokerctl import BrokerAdmin, delete_prefixed, make_prefix
from brokers import base, container, debian, find
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker


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


# --------------------------------------------------------------------------- no broker


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/%2F", "amqp://guest:***@127.0.0.1:5672/%2F"),
        ("amqps://u:p%40ss@h:5671/v?heartbeat=5", "amqps://u:***@h:5671/v?heartbeat=5"),
        ("amqp://u:p@ss@h/%2F", "amqp://u:***@h/%2F"),
        ("amqp://host:5672/%2F", "amqp://host:5672/%2F"),
        ("amqp://user@host/", "amqp://user@host/"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_broker_info_repr_hides_password() -> None:
    info = BrokerInfo("amqp://u:s3cret@h:5672/%2F", None, "env")
    assert "s3cret" not in repr(info) and "s3cret" not in str(info)


def test_prefix_shape(prefix: str) -> None:
    assert re.fullmatch(r"t-[a-z0-9-]+-[0-9a-f]{6}", prefix)
    assert "prefix-shape" in prefix
    long = make_prefix("test_" + "Very_Long[Param-Ünïcode]" * 5)
    assert len(long) <= 40 and re.fullmatch(r"[a-z0-9-]+", long)
    assert make_prefix("test_x") != make_prefix("test_x")


# --------------------------------------------------------------------------- broker


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
    # the prefix fixture deletes the user, checked by test_cleanup_removed_everything


_cleanup_probe: dict[str, str] = {}


def test_cleanup_declares(prefix: str, amqp_url: str, admin: BrokerAdmin) -> None:
    with _connect(amqp_url, f"{prefix}-decl") as conn:
        channel = conn.channel()
        channel.queue_declare(f"{prefix}.q", durable=True)
        channel.exchange_declare(f"{prefix}.x", "direct", durable=True)
        channel.exchange_declare(prefix, "fanout")
        channel.queue_declare(f"{prefix}x.keep")  # not ours: "prefix" + "." is the rule
    admin.add_user(f"{prefix}-u", "pw-not-printed", ".*", ".*", ".*", vhost=admin.vhost)
    _cleanup_probe["prefix"] = prefix


def test_cleanup_removed_everything(admin: BrokerAdmin, amqp_url: str) -> None:
    old = _cleanup_probe.get("prefix")
    if old is None:
        pytest.skip("runs after test_cleanup_declares")
    queues, exchanges, users = admin.queues(), admin.exchanges(), admin.users()
    assert f"{old}.q" not in queues
    assert f"{old}.x" not in exchanges and old not in exchanges
    assert f"{old}-u" not in users
    assert f"{old}x.keep" in queues  # outside the prefix: left alone
    assert delete_prefixed(amqp_url, [f"{old}x.keep"], kind="queue") == 1
    assert f"{old}x.keep" not in admin.queues()


# --------------------------------------------------------------------------- broker.py sources


class _FakeContainer:
    """Stands in for RabbitMqContainer, pointing at the session's (local) broker."""

    stopped: list[bool] = []  # noqa: RUF012

    def __init__(self, image: str, fail: bool = False) -> None:
        self.image, self.fail = image, fail
        self.port, self.username, self.password = 5672, "guest", "guest"
        self.env: dict[str, str] = {}

    def with_exposed_ports(self, *ports: int) -> _FakeContainer:
        return self

    def with_env(self, key: str, value: str) -> _FakeContainer:
        self.env[key] = value
        return self

    def start(self) -> _FakeContainer:
        if self.fail:
            raise RuntimeError("pull access denied")
        return self

    def get_container_host_ip(self) -> str:
        return "127.0.0.1"

    def get_exposed_port(self, port: int) -> int:
        return port

    def stop(self) -> None:
        self.stopped.append(True)


@pytest.fixture
def no_broker_here(monkeypatch: pytest.MonkeyPatch) -> Any:
    """scripts/broker.py on a machine with no env URL, nothing on :5672, no Docker, no
    Debian server and no root."""
    import broker as broker_module

    monkeypatch.delenv("RMQDELAY_URL", raising=False)
    monkeypatch.setattr(find, "LOCAL_PORT", 1)  # nothing listens on port 1
    monkeypatch.setattr(container, "docker_available", lambda: (False, "no engine"))
    monkeypatch.setattr(debian, "DEBIAN_SERVER", "/nonexistent/rabbitmq-server")
    monkeypatch.setattr(debian, "is_root", lambda: False)
    monkeypatch.setattr(find, "MANAGEMENT_TIMEOUT", 2.0)
    return broker_module


def test_no_source_explains_what_to_do(
    no_broker_here: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(no_broker_here.BrokerUnavailable) as info, no_broker_here.ensure_broker():
        pass
    text = str(info.value)
    assert "RMQDELAY_URL" in text and "rabbitmq-server" in text and "Docker" in text
    assert no_broker_here.plan().source is None
    assert no_broker_here.main(["--check"]) == 1
    assert no_broker_here.main([]) == 1
    out = capsys.readouterr()
    assert out.out == "" and "RMQDELAY_URL" in out.err


def test_testcontainers_source_lives_with_the_block(
    no_broker_here: Any, broker: BrokerInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    if broker.source == "testcontainers" or not broker.url.startswith("amqp://guest:guest@"):
        pytest.skip("the fake container points at a local guest/guest broker on 5672")
    monkeypatch.setattr(container, "docker_available", lambda: (True, "fake engine"))
    monkeypatch.setattr(container, "container_class", lambda: _FakeContainer)
    _FakeContainer.stopped.clear()
    with no_broker_here.ensure_broker() as info:
        assert info.source == "testcontainers"
        assert info.url == "amqp://guest:guest@127.0.0.1:5672/%2F"
        assert not _FakeContainer.stopped
    assert _FakeContainer.stopped == [True]
    # the CLI does not start a container that would die with it
    assert no_broker_here.main(["-q"]) == 0


def test_failed_container_falls_through(
    no_broker_here: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(container, "docker_available", lambda: (True, "fake engine"))
    monkeypatch.setattr(
        container, "container_class", lambda: lambda image: _FakeContainer(image, fail=True)
    )
    with (
        pytest.raises(no_broker_here.BrokerUnavailable, match="pull access denied"),
        no_broker_here.ensure_broker(),
    ):
        pass


def test_debian_start_that_never_answers(
    no_broker_here: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    marker = tmp_path / "started"
    server = tmp_path / "rabbitmq-server"
    server.write_text(f'#!/bin/sh\n[ "$1" = -detached ] && echo "$1" > {marker}\n')
    server.chmod(0o755)
    monkeypatch.setattr(debian, "DEBIAN_SERVER", str(server))
    monkeypatch.setattr(debian, "START_TIMEOUT", 1.0)
    assert no_broker_here.plan().source == "debian"
    with (
        pytest.raises(no_broker_here.BrokerUnavailable, match="did not answer within 1s"),
        no_broker_here.ensure_broker(),
    ):
        pass
    assert marker.read_text().strip() == "-detached"


def test_enabling_management_on_a_broker_not_ours_says_so_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No broker's plugins change here: rabbitmq-plugins is replaced; the notice is real."""
    enabled: list[tuple[str, ...]] = []

    def enable_plugins(node: Any, *plugins: str) -> tuple[bool, str]:
        enabled.append(plugins)
        return True, "enabled"

    monkeypatch.setattr(base, "_quiet", True)  # the notice prints even with --quiet
    monkeypatch.setattr(find, "management_ok", lambda *args, **kwargs: bool(enabled))
    monkeypatch.setattr(debian, "is_root", lambda: True)
    monkeypatch.setattr(debian, "plugin_listed", lambda node, plugin: False)
    monkeypatch.setattr(debian, "enable_plugins", enable_plugins)
    monkeypatch.setattr(debian, "has_tool", lambda node, tool: True)
    info = find._with_management(BrokerInfo(find.local_url(), None, "local"))
    err = capsys.readouterr().err
    assert "NOTE: enabling the rabbitmq_management plugin on the broker at 127.0.0.1:5672" in err
    assert "not started by scripts/broker.py" in err and "--no-management" in err
    assert enabled == [("rabbitmq_management",)]
    assert info.management_url == "http://127.0.0.1:15672"
