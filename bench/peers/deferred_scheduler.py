"""The one-queue engine's scheduler for RabbitMQ 4.3+, over AMQP 1.0 (qpid-proton), as a process.

    python -m bench.peers.deferred_scheduler '<amqp url>' <deferred queue> <target queue> \
        [--prefetch 1000] [--no-forward]

It consumes the deferred quorum queue. A message whose due time (the 0.9.1 header
``x-bench-due``, Unix ms) is still ahead is settled with ``modified`` (delivery-failed
false) carrying the message annotation ``x-opt-delivery-time`` = its due time: the
quorum queue holds it until then and delivers it again (RabbitMQ 4.3,
``rabbit_fifo:should_delay/5``; the key must be an AMQP *symbol*, a utf8 key closes the
session). A due message is sent to ``/queues/<target>`` (durable, unsettled) and the
original is accepted only once the broker accepted the copy: at-least-once. With
``--no-forward`` a due message is accepted at once: the figures of a worker that would
consume the deferred queue itself.

Lines on stdout::

    READY
    <message_id> <received_ms> <deferrals>     a due message, when it was seen
    DEFERRED <n>                                early messages deferred so far, when it grew
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import Any
from urllib.parse import unquote, urlsplit

from proton import Delivery, Disposition, symbol
from proton.handlers import MessagingHandler
from proton.reactor import Container

HDR_DUE = "x-bench-due"
DUE = symbol(HDR_DUE)
"""A 0.9.1 header whose name begins with ``x-`` reaches an AMQP 1.0 consumer as a
message annotation (RabbitMQ 4's ``mc_amqpl``), not an application property."""
DELIVERY_TIME = symbol("x-opt-delivery-time")
BROKER_OWN = {DELIVERY_TIME, symbol("x-routing-key"), symbol("x-exchange")}


def amqp10_address(url: str) -> tuple[str, str, str]:
    """``host:port``, user and password of an ``amqp://`` URL (vhost: the default)."""
    parts = urlsplit(url)
    host = f"{parts.hostname or '127.0.0.1'}:{parts.port or 5672}"
    return host, unquote(parts.username or "guest"), unquote(parts.password or "guest")


class Scheduler(MessagingHandler):  # type: ignore[misc,unused-ignore]
    """Defer early messages to their due time; forward due ones, confirmed, then accept."""

    def __init__(self, url: str, queue: str, target: str, prefetch: int, forward: bool) -> None:
        super().__init__(prefetch=prefetch, auto_accept=False, auto_settle=True)
        self.url, self.queue, self.target = url, queue, target
        self.forward = forward
        self.pending: dict[int, Delivery] = {}  # our copy's tag -> the original delivery
        self.tag = 0
        self.deferred = self.reported = 0
        self.lines: list[str] = []
        self.lock = threading.Lock()
        self.sender: Any = None

    def on_start(self, event: Any) -> None:
        host, user, password = amqp10_address(self.url)
        conn = event.container.connect(
            url=f"amqp://{host}",
            user=user,
            password=password,
            allowed_mechs="PLAIN",
            allow_insecure_mechs=True,
            virtual_host="vhost:/",
        )
        event.container.create_receiver(conn, f"/queues/{self.queue}")
        if self.forward:
            self.sender = event.container.create_sender(conn, f"/queues/{self.target}")

    def on_link_opened(self, event: Any) -> None:
        if event.receiver is not None:
            print("READY", flush=True)

    def on_message(self, event: Any) -> None:
        delivery, message = event.delivery, event.message
        annotations = message.annotations or {}
        due = int(annotations.get(DUE, 0))
        now = time.time_ns() // 1_000_000
        if due > now:
            delivery.local.annotations = {DELIVERY_TIME: due}
            delivery.local.failed = False
            delivery.local.undeliverable = False
            delivery.update(Disposition.MODIFIED)
            delivery.settle()
            self.deferred += 1
            return
        with self.lock:
            self.lines.append(f"{message.id} {now} {int(DELIVERY_TIME in annotations)}\n")
        if not self.forward:
            self.accept(delivery)
            return
        # the 0.9.1 headers (x- ones arrive as annotations) go on; the broker's own do not
        message.annotations = {k: v for k, v in annotations.items() if k not in BROKER_OWN}
        message.durable = True
        message.delivery_count = 0
        message.first_acquirer = False
        self.tag += 1
        copy = self.sender.send(message, tag=str(self.tag))
        self.pending[id(copy)] = delivery

    def on_accepted(self, event: Any) -> None:
        original = self.pending.pop(id(event.delivery), None)
        if original is not None:
            self.accept(original)

    def on_rejected(self, event: Any) -> None:
        self._failed(event)

    def on_released(self, event: Any) -> None:
        self._failed(event)

    def _failed(self, event: Any) -> None:
        """The copy was not taken (unroutable, rejected): the original goes back, counted."""
        original = self.pending.pop(id(event.delivery), None)
        if original is not None:
            original.local.failed = True
            original.update(Disposition.MODIFIED)
            original.settle()

    def flush(self) -> None:
        with self.lock:
            chunk, self.lines = "".join(self.lines), []
        if self.deferred != self.reported:
            self.reported = self.deferred
            chunk += f"DEFERRED {self.deferred}\n"
        if chunk:
            sys.stdout.write(chunk)
            sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("queue")
    parser.add_argument("target")
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--no-forward", dest="forward", action="store_false")
    args = parser.parse_args(argv)
    handler = Scheduler(args.url, args.queue, args.target, args.prefetch, args.forward)
    container = Container(handler)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def flusher() -> None:
        while not stop.wait(0.005):
            handler.flush()
        handler.flush()
        container.stop()

    threading.Thread(target=flusher, daemon=True).start()
    container.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
