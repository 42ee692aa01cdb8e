"""Helpers the tests share: a collecting consumer, a closed port, a local JSON API."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aio_pika

from rmqdelay.core.clock import now_ms
from rmqdelay.core.messages import DUE_AT


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Received:
    message_id: str
    body: bytes
    headers: dict[str, Any]
    received_at_ms: int
    routing_key: str = ""

    @property
    def due_at_ms(self) -> int:
        return int(self.headers[DUE_AT])

    @property
    def lateness_ms(self) -> int:
        return self.received_at_ms - self.due_at_ms


@dataclass
class Collector:
    """Consumes a queue in the background, acking, and records what arrives."""

    url: str
    queue: str
    received: list[Received] = field(default_factory=list)
    _connection: aio_pika.abc.AbstractConnection | None = None
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def __aenter__(self) -> Collector:
        self._connection = await aio_pika.connect(self.url)
        channel = await self._connection.channel()
        await channel.set_qos(prefetch_count=200)
        queue = await channel.get_queue(self.queue, ensure=True)
        await queue.consume(self._on_message)
        return self

    async def _on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        at = now_ms()
        self.received.append(
            Received(
                str(message.message_id),
                message.body,
                dict(message.headers),
                at,
                message.routing_key or "",
            )
        )
        await message.ack()
        self._arrived.set()

    async def wait_for(self, count: int, timeout: float) -> list[Received]:
        """Wait until ``count`` messages arrived or ``timeout`` passed; return them all."""
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._arrived.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), timeout=min(left, 0.5))
        return list(self.received)

    async def __aexit__(self, *exc: object) -> None:
        if self._connection is not None:
            await self._connection.close()


@contextlib.contextmanager
def json_api(answer: Callable[[str], tuple[int, Any]]) -> Iterator[str]:
    """A local HTTP server whose GETs ``answer(path)`` gives (status, JSON body): its base
    URL, for a management API that is no broker's (a wrong one, a flaky one)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = answer(self.path)
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
