"""amqps:// end to end: a TLS-terminating proxy on loopback in front of the real broker.

The broker here speaks plain AMQP, so the test puts its own TLS endpoint before it,
with a CA and a server certificate for ``localhost`` made by openssl.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rmqdelay import AsyncPublisher, Publisher, Settings, TopologyError, TopologyManager
from rmqdelay.settings import SecretUrl
from tests.helpers.support import Collector
from tests.helpers.worker_helpers import work_queue


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificates (apt-get install openssl)")
    d = tmp_path_factory.mktemp("tls")
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=rmqdelay-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        cwd=d,
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        cwd=d,
    )
    (d / "ext.cnf").write_text("subjectAltName=DNS:localhost\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "server.pem",
        cwd=d,
    )
    return d


@pytest.fixture
def tls_port(certs: Path, amqp_url: str) -> Iterator[int]:
    """A TLS endpoint on 127.0.0.1 that forwards to the broker's plain AMQP port."""
    target = urlsplit(amqp_url)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs / "server.pem", certs / "server.key")
    loop = asyncio.new_event_loop()
    ready: list[int] = []

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        broker_r, broker_w = await asyncio.open_connection(target.hostname, target.port or 5672)
        await asyncio.gather(pipe(client_r, broker_w), pipe(broker_r, client_w))

    async def serve() -> asyncio.Server:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=context)
        ready.append(server.sockets[0].getsockname()[1])
        return server

    server = loop.run_until_complete(serve())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield ready[0]
    loop.call_soon_threadsafe(server.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)


async def test_publish_and_topology_over_amqps(
    certs: Path, tls_port: int, amqp_url: str, prefix: str
) -> None:
    creds = urlsplit(amqp_url).netloc.rsplit("@", 1)[0]
    settings = Settings(
        url=f"amqps://{creds}@localhost:{tls_port}/%2F",
        prefix=prefix,
        max_delay="1m",
        tls_ca_file=certs / "ca.pem",
    )
    with TopologyManager(settings) as manager:
        manager.apply(["secure"])
    plain = settings.replace(url=SecretUrl(amqp_url))
    async with Collector(plain.url.get_secret_value(), work_queue(plain, "secure")) as collector:
        with Publisher(settings) as publisher:
            publisher.publish("secure", b"sync over tls", delay=0.05)
        async with AsyncPublisher(settings) as apublisher:
            await apublisher.publish("secure", b"async over tls", delay=0.1)
        received = await collector.wait_for(2, timeout=10)
    assert sorted(r.body for r in received) == [b"async over tls", b"sync over tls"]


def test_untrusted_certificate_is_refused(tls_port: int, amqp_url: str, prefix: str) -> None:
    creds = urlsplit(amqp_url).netloc.rsplit("@", 1)[0]
    settings = Settings(url=f"amqps://{creds}@localhost:{tls_port}/%2F", prefix=prefix)
    with pytest.raises(TopologyError, match=r"TLS failed.*tls_ca_file") as info:
        TopologyManager(settings).verify()
    assert "***" in str(info.value)
