"""A broker that accepts TCP but never answers the AMQP handshake (seen wedged here): pika
gives up with its own workflow errors, which are no ``AMQPError``. They must still come
out as one :class:`ConnectionFailedError` naming the masked URL, from the library and
from the CLI, not as a traceback. A local socket stands in for the broker."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorStackTimeout,
)

from rmqdelay import ConnectionFailedError, Settings
from rmqdelay.amqp.connections import connect_blocking, connection_failure

SECRET = "s3cret-h"


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never says a word."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        server.close()
        for conn in accepted:
            conn.close()


def _url(port: int) -> str:
    # stack_timeout: pika's limit on the whole opening (15 s by default)
    return f"amqp://guest:{SECRET}@127.0.0.1:{port}/%2F?stack_timeout=0.5"


def test_silent_broker_is_a_transient_connection_failure(silent_port: int) -> None:
    url = _url(silent_port)
    with pytest.raises(ConnectionFailedError) as info:
        connect_blocking(Settings(url=url), "test")
    text = str(info.value)
    assert info.value.transient
    assert f"guest:***@127.0.0.1:{silent_port}" in text
    assert "did not answer the AMQP handshake within 0.5s" in text
    assert SECRET not in text


def test_workflow_errors_are_classified() -> None:
    url = "amqp://guest:guest@127.0.0.1:5672/%2F"
    settings = Settings(url=url)
    timeout = AMQPConnectorStackTimeout("Timeout during AMQP handshake")
    failed = AMQPConnectionWorkflowFailed([ConnectionRefusedError(111, "refused"), timeout])
    for exc in (timeout, failed):
        failure = connection_failure(exc, url, settings)
        assert failure.transient
        assert "guest:***@127.0.0.1:5672" in str(failure)
        assert "did not answer the AMQP handshake within 15s" in str(failure)


def test_cli_says_one_line(silent_port: int) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "rmqdelay.cli", "publish", "jobs", "hi", "--delay", "1s"],
        env={"RMQDELAY_URL": _url(silent_port), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "did not answer the AMQP handshake" in done.stderr
    assert SECRET not in done.stderr + done.stdout
