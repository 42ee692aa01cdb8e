"""An order service that cancels unpaid orders 15 minutes after they were placed.

Placing an order stores it as ``unpaid`` and publishes an ``orders-timeout`` message due
15 minutes later. The worker's handler receives it at that time and cancels the order if
it is still unpaid; a paid order is left alone. The handler is idempotent (one UPDATE
guarded by the status), because delivery is at least once.

Run it (from this directory, with ``RMQDELAY_URL`` set or a broker on localhost)::

    python service.py setup                       # declare the topology, once
    rmqdelay worker service:app                   # in another terminal
    python service.py place 42                    # due in 15 min (--timeout 10s to try it)
    python service.py pay 42                      # or not, and watch it get cancelled
    python service.py show

Orders live in SQLite (``$ORDERS_DB``, default ``orders.db``), so the service and the
worker can be separate processes.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

from pydantic import BaseModel

from rmqdelay import Context, Settings
from rmqdelay.amqp.publisher import Publisher
from rmqdelay.amqp.topology_manager import TopologyManager
from rmqdelay.core.handling.retry import Backoff
from rmqdelay.core.publishing.outgoing import PublishResult
from rmqdelay.worker import Worker

DESTINATION = "orders-timeout"
PAYMENT_WINDOW = "15m"


class OrderTimeout(BaseModel):
    """The body of the timeout message."""

    order_id: int


class Orders:
    """A tiny order table: unpaid -> paid, or unpaid -> cancelled."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = str(path or os.environ.get("ORDERS_DB", "orders.db"))
        with closing(self._connect()) as db, db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL)"
            )

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10)

    def create(self, order_id: int) -> None:
        with closing(self._connect()) as db, db:
            db.execute("INSERT INTO orders (id, status) VALUES (?, 'unpaid')", (order_id,))

    def pay(self, order_id: int) -> bool:
        return self._move(order_id, "unpaid", "paid")

    def cancel_if_unpaid(self, order_id: int) -> bool:
        return self._move(order_id, "unpaid", "cancelled")

    def _move(self, order_id: int, old: str, new: str) -> bool:
        with closing(self._connect()) as db, db:
            cursor = db.execute(
                "UPDATE orders SET status = ? WHERE id = ? AND status = ?", (new, order_id, old)
            )
            return cursor.rowcount == 1

    def status(self, order_id: int) -> str | None:
        with closing(self._connect()) as db:
            row = db.execute("SELECT status FROM orders WHERE id = ?", (order_id,)).fetchone()
        return None if row is None else str(row[0])

    def all(self) -> list[tuple[int, str]]:
        with closing(self._connect()) as db:
            return [(int(i), str(s)) for i, s in db.execute("SELECT id, status FROM orders")]


# ----------------------------------------------------------------------------- service


def setup(settings: Settings) -> None:
    """Declare the delay tiers and the orders-timeout work queue (needs configure rights)."""
    with TopologyManager(settings) as topology:
        topology.apply([DESTINATION])


def place_order(
    publisher: Publisher, orders: Orders, order_id: int, timeout: str = PAYMENT_WINDOW
) -> PublishResult:
    """Store an unpaid order and schedule its timeout (confirmed by the broker).

    The message id is derived from the order, so a retried ``place`` call that publishes
    twice still names one timeout (the handler is idempotent either way).
    """
    orders.create(order_id)
    return publisher.publish(
        DESTINATION,
        OrderTimeout(order_id=order_id),
        delay=timeout,
        message_id=f"order-{order_id}-timeout",
    )


# ----------------------------------------------------------------------------- worker

app = Worker(backoff=Backoff.exponential("1s", max="1m", jitter=0.1), max_attempts=5)


@app.handler(DESTINATION)
def cancel_if_unpaid(msg: OrderTimeout, ctx: Context) -> None:
    """Runs when the payment window has passed. A sync handler: the worker threads it."""
    if Orders().cancel_if_unpaid(msg.order_id):
        ctx.logger.info("order %d cancelled: not paid in time", msg.order_id)
    else:
        ctx.logger.info("order %d left alone: paid or already cancelled", msg.order_id)


# ----------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None, settings: Settings | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="declare the topology")
    place = commands.add_parser("place", help="place an unpaid order")
    place.add_argument("order_id", type=int)
    place.add_argument("--timeout", default=PAYMENT_WINDOW, help="payment window, e.g. 15m")
    pay = commands.add_parser("pay", help="pay an order")
    pay.add_argument("order_id", type=int)
    commands.add_parser("show", help="list the orders")
    args = parser.parse_args(argv)

    settings = settings or Settings()
    orders = Orders()
    if args.command == "setup":
        setup(settings)
        print(f"topology {settings.prefix} ready on {settings.masked_url}")
    elif args.command == "place":
        with Publisher(settings) as publisher:
            result = place_order(publisher, orders, args.order_id, args.timeout)
        due = result.due_at.isoformat(timespec="seconds")
        print(f"order {args.order_id} placed; cancelled at {due} unless paid")
    elif args.command == "pay":
        paid = orders.pay(args.order_id)
        print(f"order {args.order_id} {'paid' if paid else 'could not be paid'}")
        return 0 if paid else 1
    else:
        for order_id, status in orders.all():
            print(f"{order_id}\t{status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
