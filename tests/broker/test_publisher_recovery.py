"""Publishers on the real broker at their hard edges: bad input, a silent broker, a dropped
connection.

A silent broker is a TCP proxy that stops forwarding: the client's writes succeed and no
answer ever comes, which is what a hung node or a dead network path looks like.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pika
import pytest

from rmqdelay import (
    AsyncPublisher,
    InvalidDestinationError,
    InvalidMessageError,
    Publisher,
    PublisherClosedError,
    PublishError,
    Settings,
    TopologyManager,
)
from rmqdelay.amqp.aio_publisher import _is_open
from rmqdelay.amqp.connections import connect_async, connect_blocking
from rmqdelay.settings import SecretUrl
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.support import Collector
from tests.helpers.worker_helpers import work_queue

T = TypeVar("T")
BOUND = 10.0
"""What the brief allows a call that used to hang: it must return or raise by then."""
DEST = "orders"


def within(seconds: float, call: Callable[[], T]) -> T:
    """Run ``call`` in a thread; fail, not hang, if it is still blocked after ``seconds``."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still blocked after {seconds}s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


def ready(settings: Settings, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


class SilentProxy:
    """Forwards TCP to the broker until ``freeze()``; then holds every byte it reads."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _address = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            self.sockets += [client, upstream]
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                while self.frozen.is_set():
                    time.sleep(0.01)
                target.sendall(data)
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.close()

    def freeze(self) -> None:
        self.frozen.set()

    def stop(self) -> None:
        """Refuse new connections and cut the ones open: the broker is gone."""
        for sock in (self.listener, *self.sockets):  # shutdown wakes the blocked accept()
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@pytest.fixture
def settings(amqp_url: str, prefix: str) -> Iterator[Settings]:
    settings = Settings(url=amqp_url, prefix=prefix, max_delay="1h", connection_name=prefix)
    with TopologyManager(settings) as manager:
        manager.apply([DEST])
    yield settings


@pytest.fixture
def proxy(amqp_url: str) -> Iterator[SilentProxy]:
    parts = urlsplit(str(amqp_url))
    proxy = SilentProxy(parts.hostname or "127.0.0.1", parts.port or 5672)
    yield proxy
    proxy.stop()


def through(settings: Settings, proxy: SilentProxy, confirm_timeout: float = 1.0) -> Settings:
    parts = urlsplit(settings.url.get_secret_value())
    netloc = f"{parts.netloc.rsplit('@', 1)[0]}@127.0.0.1:{proxy.port}"
    url = urlunsplit(parts._replace(netloc=netloc))
    return settings.replace(url=SecretUrl(url), confirm_timeout=confirm_timeout)


# ---------------------------------------------------------------- inputs that hung


@pytest.mark.usefixtures("pika_path")
def test_inputs_that_hung_the_sync_publisher_raise_at_once(settings: Settings) -> None:
    with Publisher(settings) as publisher:
        with pytest.raises(InvalidDestinationError, match="control characters"):
            within(BOUND, lambda: publisher.publish("bad\n", b"x", delay="5m"))
        with pytest.raises(InvalidMessageError, match=r"headers\['k'\] is an int of 71 bits"):
            within(BOUND, lambda: publisher.publish(DEST, b"x", delay="5m", headers={"k": 2**70}))
        with pytest.raises(InvalidMessageError):
            publisher.publish(DEST, b"x", delay=0, headers={1: "v"})  # type: ignore[dict-item]
        assert ready(settings, work_queue(settings, DEST)) == 0  # nothing was sent
        # and the publisher is still good
        assert within(BOUND, lambda: publisher.publish(DEST, b"ok", delay=0)).hops == 0
    assert ready(settings, work_queue(settings, DEST)) == 1


async def test_the_async_publisher_refuses_the_same_inputs_the_same_way(
    settings: Settings,
) -> None:
    async with AsyncPublisher(settings) as publisher:
        with pytest.raises(InvalidDestinationError, match="control characters"):
            await asyncio.wait_for(publisher.publish("bad\n", b"x", delay="5m"), BOUND)
        with pytest.raises(InvalidMessageError, match=r"headers\['k'\] is an int of 71 bits"):
            await asyncio.wait_for(
                publisher.publish(DEST, b"x", delay="5m", headers={"k": 2**70}), BOUND
            )
        with pytest.raises(InvalidMessageError, match="headers has a name that is not a str"):
            await publisher.publish(DEST, b"x", delay=0, headers={1: "v"})  # type: ignore[dict-item]
        assert ready(settings, work_queue(settings, DEST)) == 0
        assert (await publisher.publish(DEST, b"ok", delay=0)).hops == 0


# ---------------------------------------------------------------- a silent broker


def test_sync_publisher_waits_no_longer_than_its_timeouts(
    settings: Settings, proxy: SilentProxy
) -> None:
    quiet = through(settings, proxy, confirm_timeout=1.0)
    publisher = Publisher(quiet).connect()
    publisher.publish(DEST, b"warm", delay=0)
    proxy.freeze()
    started = time.monotonic()
    with pytest.raises(PublishError, match="confirm"):
        within(BOUND, lambda: publisher.publish(DEST, b"unanswered", delay=0))
    with pytest.raises(PublisherClosedError):  # a passive check, then opening a channel
        within(BOUND, lambda: publisher.publish("elsewhere", b"x", delay=0))
    with pytest.raises(PublisherClosedError):
        within(BOUND, lambda: publisher.publish(DEST, b"x", delay=0))
    within(BOUND, publisher.close)
    assert time.monotonic() - started < 4 * quiet.confirm_timeout + 2


async def test_async_publisher_waits_no_longer_than_its_timeouts(
    settings: Settings, proxy: SilentProxy
) -> None:
    quiet = through(settings, proxy, confirm_timeout=1.0)
    publisher = await AsyncPublisher(quiet).connect()
    await publisher.publish(DEST, b"warm", delay=0)
    proxy.freeze()
    started = time.monotonic()
    with pytest.raises(PublishError, match="confirm"):
        await asyncio.wait_for(publisher.publish(DEST, b"unanswered", delay=0), BOUND)
    with pytest.raises(PublisherClosedError, match="passive check"):
        await asyncio.wait_for(publisher.publish("elsewhere", b"x", delay=0), BOUND)
    await asyncio.wait_for(publisher.close(), BOUND)
    assert time.monotonic() - started < 3 * quiet.confirm_timeout + 2


# ---------------------------------------------------------------- a dropped connection


@pytest.mark.usefixtures("pika_path")
def test_sync_publisher_reconnects_after_its_connection_is_closed(
    settings: Settings, admin: BrokerAdmin, prefix: str
) -> None:
    with Publisher(settings) as publisher:
        publisher.publish(DEST, b"before", delay=0)
        assert admin.close_connections(f"{prefix}.pub") == 1
        result = within(BOUND, lambda: publisher.publish(DEST, b"after", delay=0.2))
        assert [c["connection_name"] for c in admin.wait_for_connections(f"{prefix}.pub")] == [
            f"{prefix}.pub"
        ]
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        channel = connection.channel()
        bodies: list[tuple[bytes | None, str | None]] = []
        for method, props, body in channel.consume(
            work_queue(settings, DEST), inactivity_timeout=5
        ):
            assert method is not None and props is not None, f"only {bodies} arrived"
            channel.basic_ack(int(method.delivery_tag or 0))
            bodies.append((body, props.message_id))
            if len(bodies) == 2:
                break
    finally:
        connection.close()
    assert bodies[1] == (b"after", result.message_id)


async def test_async_publisher_reconnects_after_its_connection_is_closed(
    settings: Settings, admin: BrokerAdmin, prefix: str, aio_path: str
) -> None:
    async with (
        Collector(settings.url.get_secret_value(), work_queue(settings, DEST)) as collector,
        AsyncPublisher(settings) as publisher,
    ):
        await publisher.publish(DEST, b"before", delay=0)
        # in a thread, so that the loop reads the broker's Connection.Close meanwhile
        assert await asyncio.to_thread(admin.close_connections, f"{prefix}.pub") == 1
        # until the client has read the broker's Connection.Close: before that, a publish
        # goes into the closing connection and may fail (the documented "may or may not")
        connection = publisher._connection
        assert connection is not None
        deadline = time.monotonic() + BOUND
        while _is_open(connection) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert not _is_open(connection), "the client never saw its connection close"
        result = await asyncio.wait_for(publisher.publish(DEST, b"after", delay=0.2), BOUND)
        batch = await publisher.publish_many(
            [{"destination": DEST, "body": f"m{i}", "delay": 0} for i in range(3)]
        )
        received = await collector.wait_for(5, timeout=10)
    assert sorted(r.body for r in received) == [b"after", b"before", b"m0", b"m1", b"m2"]
    assert {r.message_id for r in received} >= {result.message_id, *(b.message_id for b in batch)}


@pytest.mark.usefixtures("pika_path")
def test_a_publisher_on_a_given_connection_says_why_it_cannot_publish(
    settings: Settings, admin: BrokerAdmin, prefix: str
) -> None:
    connection = connect_blocking(settings, "mine")
    publisher = Publisher(settings, connection=connection)
    publisher.publish(DEST, b"x", delay=0)
    assert admin.close_connections(f"{prefix}.mine") == 1
    with pytest.raises(PublisherClosedError, match="given to this publisher is closed"):
        within(BOUND, lambda: publisher.publish(DEST, b"y", delay=0))


async def test_an_async_publisher_on_a_given_connection_says_why(
    settings: Settings, admin: BrokerAdmin, prefix: str
) -> None:
    connection = await connect_async(settings, "mine")
    publisher = await AsyncPublisher(settings, connection=connection).connect()
    await publisher.publish(DEST, b"x", delay=0)
    assert await asyncio.to_thread(admin.close_connections, f"{prefix}.mine") == 1
    # until the client has read the broker's Connection.Close: before that, a publish goes
    # into the closing connection and fails as unconfirmed (RabbitMQ 4.0, 1 CI run)
    deadline = time.monotonic() + BOUND
    while _is_open(connection) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    with pytest.raises(PublisherClosedError, match="given to this publisher is closed"):
        await asyncio.wait_for(publisher.publish(DEST, b"y", delay=0), BOUND)


@pytest.mark.usefixtures("pika_path")
def test_reconnecting_gives_up_after_three_attempts(settings: Settings, proxy: SilentProxy) -> None:
    publisher = Publisher(through(settings, proxy)).connect()
    publisher.publish(DEST, b"x", delay=0)
    proxy.stop()  # the broker is gone: every attempt is refused
    started = time.monotonic()
    with pytest.raises(PublisherClosedError, match="3 attempts to reconnect failed"):
        within(BOUND, lambda: publisher.publish(DEST, b"y", delay=0))
    assert time.monotonic() - started >= 2.5  # the pauses between attempts: 0.5 s, 2 s


async def test_async_reconnecting_gives_up_after_three_attempts(
    settings: Settings, proxy: SilentProxy
) -> None:
    publisher = await AsyncPublisher(through(settings, proxy)).connect()
    await publisher.publish(DEST, b"x", delay=0)
    proxy.stop()
    await asyncio.sleep(0.2)  # the loop reads the end of the stream
    with pytest.raises(PublisherClosedError, match="3 attempts to reconnect failed"):
        await asyncio.wait_for(publisher.publish(DEST, b"y", delay=0), BOUND)


# ---------------------------------------------------------------- a node that stops confirming


def _frozen_first(settings: Settings, proxy: SilentProxy) -> Settings:
    """Two addresses of the one broker: through the proxy first (it will stop answering,
    as a node cut off from its cluster's majority does), then direct."""
    proxied = through(settings, proxy).url.get_secret_value()
    both = SecretUrl(f"{proxied},{settings.url.get_secret_value()}")
    return settings.replace(url=both, confirm_timeout=1.0)


def test_sync_publisher_sends_again_on_another_node_what_got_no_confirm(
    settings: Settings, proxy: SilentProxy
) -> None:
    failing = _frozen_first(settings, proxy)
    with Publisher(failing) as publisher:
        publisher.publish(DEST, b"warm", delay=0)
        proxy.freeze()
        started = time.monotonic()
        results = within(
            BOUND,
            lambda: publisher.publish_many(
                [{"destination": DEST, "body": f"m{i}".encode(), "delay": 0} for i in range(5)]
            ),
        )
        took = time.monotonic() - started
        assert len(results) == 5  # confirmed by the second address
        again = within(BOUND, lambda: publisher.publish(DEST, b"after", delay=0))
    assert took < 2 * failing.confirm_timeout + 2  # one confirm timeout, then the move
    assert again.message_id
    assert ready(settings, work_queue(settings, DEST)) >= 7


async def test_async_publisher_sends_again_on_another_node_what_got_no_confirm(
    settings: Settings, proxy: SilentProxy
) -> None:
    failing = _frozen_first(settings, proxy)
    async with AsyncPublisher(failing) as publisher:
        await publisher.publish(DEST, b"warm", delay=0)
        proxy.freeze()
        result = await asyncio.wait_for(publisher.publish(DEST, b"moved", delay=0), BOUND)
        assert result.message_id
    assert ready(settings, work_queue(settings, DEST)) >= 2
