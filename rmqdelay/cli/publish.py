"""``rmqdelay publish`` and ``rmqdelay consume``: one message in, messages out."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.exceptions import Exit

from .options import (
    Command,
    argument,
    broker_options,
    duration_us,
    epilog,
    err,
    friendly_errors,
    settings_from,
    usage_error,
)

if TYPE_CHECKING:
    import pika

    from ..core.layout import Layout

__all__ = ["consume", "publish"]

# The broker client, the settings and rich are imported inside the commands: see options.


def _parse_headers(pairs: Sequence[str]) -> dict[str, str]:
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise usage_error(f"--header {pair!r} must look like key=value")
        headers[key] = value
    return headers


def _parse_at(text: str) -> datetime:
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise usage_error(
            f"--at {text!r} is not ISO 8601, e.g. 2026-11-21T15:00:00+00:00"
        ) from None
    if at.tzinfo is None:
        raise usage_error(f"--at {text!r} has no timezone: add one, e.g. +00:00 or Z")
    return at


@click.command(
    "publish",
    cls=Command,
    epilog=epilog(
        "",
        "rmqdelay publish orders-timeout '{\"order\": 42}' --json --delay 15m",
        "echo hi | rmqdelay publish emails - --at 2026-12-01T09:00:00Z",
    ),
)
@argument("destination", help="The destination (work queue name).")
@argument("body", help="The body; '-' reads standard input.", default="")
@click.option("--delay", metavar="DURATION", help="e.g. 1.5s, 15m, 2h30m.")
@click.option("--at", metavar="TIME", help="Due time, ISO 8601 with a timezone.")
@click.option("-H", "--header", multiple=True, metavar="KEY=VALUE", help="k=v; repeat.")
@click.option("--message-id", metavar="ID", help="Default: a new uuid.")
@click.option("--json", "as_json", is_flag=True, help="Send the body as JSON.")
@broker_options
@friendly_errors
def publish(
    destination: str,
    body: str,
    delay: str | None,
    at: str | None,
    header: tuple[str, ...],
    message_id: str | None,
    as_json: bool,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Publish one delayed message and print its id and due time."""
    if (delay is None) == (at is None):
        raise usage_error("give exactly one of --delay or --at")
    # the command line is read whole before anything connects: its mistakes exit 2
    if delay is not None:
        duration_us(delay, "--delay")
    due_at = _parse_at(at) if at is not None else None
    headers = _parse_headers(header)
    text = sys.stdin.read() if body == "-" else body
    payload: Any = text
    if as_json:
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--json was given but the body is not JSON: {exc}") from None
    settings = settings_from(url, prefix, config)
    from ..amqp.publisher import Publisher

    with Publisher(settings) as publisher:
        result = publisher.publish(
            destination,
            payload,
            delay=delay,
            at=due_at,
            headers=headers,
            message_id=message_id,
        )
    due = result.due_at.isoformat(timespec="milliseconds")
    # plain print, not rich: one line as is, never wrapped, and no rich import (start-up)
    print(f"{result.message_id} due {due}", flush=True)


def _plain(value: Any) -> Any:
    """Make AMQP header values JSON-friendly."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _body_fields(body: bytes) -> dict[str, Any]:
    try:
        return {"body": body.decode()}
    except UnicodeDecodeError:
        return {"body": None, "body_base64": base64.b64encode(body).decode()}


@click.command(
    "consume",
    cls=Command,
    epilog=epilog(
        "Exits 1 when --timeout passes before --count messages.",
        "rmqdelay consume orders-timeout --count 5 --timeout 30 --json",
    ),
)
@argument("destination", help="The destination (work queue name).")
@click.option("--count", type=click.IntRange(min=1), metavar="N", help="Stop after N messages.")
@click.option(
    "--timeout", type=click.FloatRange(min=0), metavar="S", help="Give up after S seconds."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@broker_options
@friendly_errors
def consume(
    destination: str,
    count: int | None,
    timeout: float | None,
    as_json: bool,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Receive, print and ack messages of a destination."""
    from rich.markup import escape

    from ..amqp.connections import connect_blocking
    from ..amqp.passive import queue_exists
    from ..core.outgoing import unknown_destination
    from ..core.routing import validate_destination

    settings = settings_from(url, prefix, config)
    queue = settings.layout.work_queue(validate_destination(settings.layout, destination))
    connection = connect_blocking(settings, "consume")
    received = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        if not queue_exists(connection, queue, settings.confirm_timeout):
            raise unknown_destination(settings.layout, destination)
        cancels = _Cancels(connection, settings.layout)
        _say_waiting(queue, count, timeout)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=min(count or 100, 100))
        for method, props, body in channel.consume(queue, inactivity_timeout=0.1):
            if method is not None and props is not None and body is not None:
                if cancels.has(props):  # cancelled: settle it, show nothing
                    channel.basic_ack(int(method.delivery_tag or 0))
                    err().print(f"cancelled: {escape(props.message_id or '-')} (acked, not shown)")
                    continue
                _print_message(props, body, as_json)
                channel.basic_ack(int(method.delivery_tag or 0))
                received += 1
            if count is not None and received >= count:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
        channel.cancel()
    finally:
        if connection.is_open:
            connection.close()
    if count is not None and received < count:
        err().print(f"timeout: received {received} of {count} messages")
        raise Exit(1)


def _say_waiting(queue: str, count: int | None, timeout: float | None) -> None:
    """Say on stderr what the command waits for, so a silent terminal is not a hang."""
    what = f"{count} message(s)" if count is not None else "messages"
    until = "until Ctrl-C; --timeout S stops sooner" if timeout is None else f"up to {timeout:g}s"
    err().print(f"waiting for {what} on queue {queue} ({until})", highlight=False)


class _Cancels:
    """The journal's tombstones, read again when a message comes more than 2 s later.

    A tombstone names copies (id and due time), so a message is asked about by both:
    a copy re-scheduled after the cancel is shown. Reading the journal again from its
    start folds to the same tombstones (each copy's last record decides).
    """

    def __init__(self, connection: pika.BlockingConnection, layout: Layout) -> None:
        from ..core.journal import Tombstones

        self.connection, self.layout = connection, layout
        self.tombstones: Tombstones = Tombstones()
        self.read_at = 0.0

    def has(self, props: pika.BasicProperties) -> bool:
        from ..core.messages import DUE_AT
        from ..core.parking import header_int

        message_id = props.message_id
        if not self.layout.journal or message_id is None:
            return False
        if time.monotonic() - self.read_at > 2.0:
            from ..amqp.journal import read_journal

            for record in read_journal(self.connection, self.layout):
                self.tombstones.add(record)
            self.read_at = time.monotonic()
        due_ms = header_int(props.headers or {}, DUE_AT, -1)
        now_ms = time.time_ns() // 10**6
        return self.tombstones.is_cancelled(message_id, now_ms, due_ms if due_ms >= 0 else None)


def _print_message(props: pika.BasicProperties, body: bytes, as_json: bool) -> None:
    from ..core.messages import DUE_AT

    now_ms = time.time_ns() // 1_000_000
    headers: dict[str, Any] = dict(props.headers or {})
    due = headers.get(DUE_AT)
    record = {
        "message_id": props.message_id,
        **_body_fields(body),
        "headers": _plain(headers),
        "due_at_ms": due,
        "received_at_ms": now_ms,
        "lateness_ms": None if due is None else now_ms - int(due),
    }
    if as_json:
        print(json.dumps(record), flush=True)
        return
    due_text = (
        datetime.fromtimestamp(int(due) / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
        if due is not None
        else "-"
    )
    print(
        f"{record['message_id']}  due {due_text}  late {record['lateness_ms']} ms  "
        f"{record['body'] if record['body'] is not None else '<binary>'}",
        flush=True,
    )
