"""What a worker does when it cannot connect: retry what may pass, stop on what won't.

A refused or dropped connection is retried with backoff, at start as later; wrong
credentials, an unknown virtual host or a missing permission stop the worker at once
with a message naming what to fix, instead of retrying for ever.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from urllib.parse import urlsplit, urlunsplit

import pytest

from rmqdelay import Settings, Worker, WorkerError
from rmqdelay.amqp.connections import connect_async, connect_blocking
from rmqdelay.errors import ConnectionFailedError
from rmqdelay.settings import SecretUrl
from tests.helpers.brokerctl import BrokerAdmin, with_login
from tests.helpers.worker_helpers import TestTopology, wait_until


def worker_for(settings: Settings, destination: str = "jobs") -> Worker:
    app = Worker(settings)

    @app.handler(destination)
    async def handle(body: bytes) -> None:
        raise AssertionError("never called: the worker must not get this far")

    return app


async def start_fails(settings: Settings, destination: str = "jobs") -> tuple[str, float]:
    """Run a worker that must stop by itself; its error and how long it took."""
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        await asyncio.wait_for(worker_for(settings, destination).runner(settings).run(), 30)
    return str(info.value), time.monotonic() - started


async def test_a_wrong_password_stops_the_worker_at_once(amqp_url: str, prefix: str) -> None:
    secret = uuid.uuid4().hex
    user = urlsplit(str(amqp_url)).username or "guest"
    settings = Settings(url=with_login(amqp_url, user, secret), prefix=prefix, max_delay="1h")
    message, took = await start_fails(settings)
    assert "refused the login" in message and f"user {user!r}" in message
    assert "wrong user name or password" in message and "RMQDELAY_URL" in message
    assert secret not in message and "***" in message
    assert took < 10  # one attempt, not a retry loop


async def test_an_unknown_vhost_is_named(amqp_url: str, prefix: str) -> None:
    parts = urlsplit(str(amqp_url))
    vhost = f"{prefix}-nowhere"
    url = with_login(amqp_url, parts.username or "guest", parts.password or "", f"/{vhost}")
    settings = Settings(url=url, prefix=prefix, max_delay="1h")
    message, took = await start_fails(settings)
    assert f"virtual host {vhost!r} does not exist" in message, message
    assert took < 10


async def test_both_clients_name_the_vhost_in_the_same_words(amqp_url: str, prefix: str) -> None:
    parts = urlsplit(str(amqp_url))
    url = with_login(amqp_url, parts.username or "guest", parts.password or "", f"/{prefix}-x")
    settings = Settings(url=url, prefix=prefix)
    with pytest.raises(ConnectionFailedError) as sync_error:
        connect_blocking(settings, "test")
    with pytest.raises(ConnectionFailedError) as async_error:
        await connect_async(settings, "test")
    assert str(sync_error.value) == str(async_error.value)
    assert not sync_error.value.transient and not async_error.value.transient


async def test_a_user_without_access_to_the_vhost_is_told_so(
    amqp_url: str, admin: BrokerAdmin, prefix: str
) -> None:
    user, secret = f"{prefix}-novhost", uuid.uuid4().hex
    admin.add_user(user, secret, "", "", "")
    admin.clear_permissions(user, admin.vhost)
    settings = Settings(url=with_login(amqp_url, user, secret), prefix=prefix, max_delay="1h")
    message, _took = await start_fails(settings)
    assert f"user {user!r} has no access to virtual host '/'" in message, message
    assert secret not in message


async def test_no_read_permission_on_the_work_queue_names_queue_and_permission(
    amqp_url: str, admin: BrokerAdmin, prefix: str, shared_topology: TestTopology
) -> None:
    dest = shared_topology.dest("jobs")
    settings = shared_topology.settings([dest])
    queue = settings.layout.work_queue(dest)
    user, secret = f"{prefix}-noread", uuid.uuid4().hex
    # may read everything but its work queue; may write (the journal marker, retries)
    admin.add_user(user, secret, "^$", ".*", "^(?!" + queue.replace(".", r"\.") + "$).*")
    limited = settings.replace(url=SecretUrl(with_login(amqp_url, user, secret)))
    message, took = await start_fails(limited, dest)
    assert f"no read permission on work queue {queue!r}" in message, message
    assert took < 15


async def test_a_refused_address_is_retried_with_backoff_and_logged_masked(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = uuid.uuid4().hex
    settings = Settings(url=f"amqp://guest:{secret}@127.0.0.1:1/%2F", prefix=prefix)
    runner = worker_for(settings).runner(settings)
    caplog.set_level(logging.WARNING, logger="rmqdelay.worker")

    def retries() -> list[str]:
        return [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]

    task = asyncio.create_task(runner.run())
    try:
        await wait_until(lambda: len(retries()) >= 2 or task.done(), 10, "two retries")
        assert not task.done(), "the worker gave up on a refused connection"
        shown = retries()
        assert all("amqp://guest:***@127.0.0.1:1/%2F" in line for line in shown), shown
        assert all("connection refused" in line for line in shown)
        assert "(attempt 2)" in shown[1]
        assert not any(secret in r.getMessage() for r in caplog.records)
    finally:
        runner.stop()
        assert await asyncio.wait_for(task, 5) == 0


async def test_tls_to_a_plain_port_stops_the_worker_in_the_words_of_both_clients(
    amqp_url: str, prefix: str
) -> None:
    # aiormq raises its own AMQPConnectionError from the SSLError: retried for ever before
    parts = urlsplit(str(amqp_url))
    settings = Settings(url=urlunsplit(parts._replace(scheme="amqps")), prefix=prefix)
    with pytest.raises(ConnectionFailedError) as sync_error:
        connect_blocking(settings, "test")
    with pytest.raises(ConnectionFailedError) as async_error:
        await connect_async(settings, "test")
    assert str(sync_error.value) == str(async_error.value)
    assert "does not speak TLS on that port" in str(async_error.value)
    assert not sync_error.value.transient and not async_error.value.transient
    message, took = await start_fails(settings)
    assert "TLS failed (WRONG_VERSION_NUMBER)" in message and took < 10
