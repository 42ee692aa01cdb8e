"""``rmqdelay publish`` and ``rmqdelay consume``: one message in, messages out."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click
from click.exceptions import Exit

from ..core.clock import iso_of_ms, now_ms
from ..core.messages import JSON
from .options import (
    Command,
    argument,
    at_option,
    broker_options,
    delay_option,
    duration_us,
    epilog,
    friendly_errors,
    header_pairs,
    json_option,
    settings_from,
    time_value,
    usage_error,
)
from .output import err, print_json

if TYPE_CHECKING:
    from ..core.publishing.outgoing import ConflictChoice
    from ..settings import Settings
    from ..worker import Delivery, Settled

__all__ = ["DESTINATION_HELP", "consume", "publish", "read_body"]

DESTINATION_HELP = "The destination (work queue name)."

# The broker client, the settings and rich are imported inside the commands: see options.


def read_body(body: str, content_type: str | None) -> tuple[Any, str | None]:
    """The body argument (``-``: standard input) and its properties. ``--content-type
    json`` (or ``application/json``) sends it as JSON, checked; another type sends the
    text with that type. Without one, a body that is a JSON object or array is sent as
    JSON, and said on stderr; anything else as text."""
    text = sys.stdin.read() if body == "-" else body
    if content_type in ("json", JSON):
        try:
            return json.loads(text), None
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"--content-type {content_type} but the body is not JSON: {exc}"
            ) from None
    if content_type is not None:
        return text, content_type
    if text.lstrip()[:1] in ("{", "["):
        try:
            payload = json.loads(text)
        except json.JSONDecodeError:
            return text, None
        err().print(
            f"the body is JSON: sent as {JSON} (--content-type text/plain sends it as text)",
            highlight=False,
        )
        return payload, None
    return text, None


CONTENT_TYPE = click.option(
    "--content-type",
    metavar="TYPE",
    help="The body's type: json checks the body and sends it as JSON; any other (e.g. "
    "text/csv) sends the text with that type. Default: a JSON object or array is sent "
    "as JSON (said on stderr), anything else as text.",
)


@click.command(
    "publish",
    cls=Command,
    epilog=epilog(
        "",
        "rmqdelay publish orders-timeout '{\"order\": 42}' --delay 15m --json",
        "echo hi | rmqdelay publish emails - --at 2026-12-01T09:00:00Z",
        "rmqdelay publish reminders hi --delay 1h --key order-42 --on-conflict ignore",
    ),
)
@argument("destination", help=DESTINATION_HELP)
@argument("body", help="The body; '-' reads standard input.", default="")
@delay_option("The due time from now")
@at_option("The due time")
@click.option("-H", "--header", multiple=True, metavar="KEY=VALUE", help="k=v; repeat.")
@click.option("--message-id", metavar="ID", help="Default: a new uuid.")
@CONTENT_TYPE
@json_option(lines=False)
@click.option(
    "--key",
    metavar="KEY",
    help="At most one pending message per key (needs the schedule journal).",
)
@click.option(
    "--on-conflict",
    type=click.Choice(["ignore", "replace"]),
    metavar="MODE",
    help="With --key, required: ignore (keep the pending message) or replace it.",
)
@broker_options
@friendly_errors
def publish(
    destination: str,
    body: str,
    delay: str | None,
    at: str | None,
    header: tuple[str, ...],
    message_id: str | None,
    content_type: str | None,
    as_json: bool,
    key: str | None,
    on_conflict: str | None,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Publish one delayed message and print its id and due time.

    With --key: what the key made of it (scheduled, ignored while another message with
    the key is pending: that message's id and due time, or replaced)."""
    if (delay is None) == (at is None):
        raise usage_error("give exactly one of --delay or --at")
    if key is not None and on_conflict is None:
        raise usage_error(
            f"--key {key!r} needs --on-conflict: ignore (keep the pending message with that "
            "key, drop this one) or replace (drop the pending one, schedule this)"
        )
    if on_conflict is not None and key is None:
        raise usage_error("--on-conflict is for a keyed publish: give --key too")
    # the command line is read whole before anything connects: its mistakes exit 2
    if delay is not None:
        duration_us(delay, "--delay")
    due_at = time_value(at)
    headers = header_pairs(header)
    payload, content_type = read_body(body, content_type)
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
            key=key,
            on_conflict=cast("ConflictChoice | None", on_conflict),
            content_type=content_type,
        )
    # plain print, not rich: one line as is, never wrapped, and no rich import (start-up)
    if as_json:
        print_json(result.to_json())
    else:
        print(result.describe(), flush=True)


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
@argument("destination", help=DESTINATION_HELP)
@click.option("--count", type=click.IntRange(min=1), metavar="N", help="Stop after N messages.")
@click.option(
    "--timeout", type=click.FloatRange(min=0), metavar="S", help="Give up after S seconds."
)
@json_option(lines=True)
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

    import asyncio  # here, not at the top: publish does not need it (start-up)

    from ..core.routing import validate_destination

    settings = settings_from(url, prefix, config)
    validate_destination(settings.layout, destination)
    received = asyncio.run(_consume(settings, destination, count, timeout, as_json))
    if count is not None and received < count:
        err().print(f"timeout: received {received} of {count} messages")
        raise Exit(1)


async def _consume(
    settings: Settings, destination: str, count: int | None, timeout: float | None, as_json: bool
) -> int:
    """A :class:`~rmqdelay.Worker` whose handler prints: the worker's journal tail skips
    (and acks) a cancelled copy, its settle acks what was shown. One message at a time,
    so nothing past ``count`` is shown; how many were shown. On a held destination the
    worker holds what comes early (up to ``max_held``, its prefetch 1 + that) and hands
    each over when due, so nothing is printed early and a message due now is not kept
    waiting behind held ones."""
    import asyncio

    from ..core.handling.retry import Requeue
    from ..worker import Worker, WorkerHook

    class _SaysCancelled(WorkerHook):
        """A cancelled copy is acked and not shown: say so on stderr."""

        def after_settle(self, delivery: Delivery, settled: Settled) -> None:
            if settled.outcome == "cancelled":
                from rich.markup import escape

                err().print(f"cancelled: {escape(delivery.message_id)} (acked, not shown)")

    held = await _check_queue(settings, destination)
    _say_waiting(settings.layout.work_queue(destination), count, timeout)
    if held:
        err().print(
            f"held destination: messages come up to {settings.layout.hold_ms} ms early and "
            f"are shown when due (up to {settings.max_held} held at once)",
            highlight=False,
        )
    shown = 0
    enough = asyncio.Event()
    broken: list[OSError] = []

    async def show(body: bytes, ctx: Any) -> None:  # ctx: the handler's Context
        nonlocal shown
        if enough.is_set():
            raise Requeue("consume has shown what it was asked to")
        try:
            _print_message(ctx.message_id, body, ctx.headers, as_json)
        except OSError as exc:  # stdout closed (a pipe to `head`): give it back
            broken.append(exc)
            enough.set()
            raise Requeue("consume's output is closed") from None
        shown += 1
        if count is not None and shown >= count:
            enough.set()

    app = Worker(settings, max_attempts=1, hooks=[_SaysCancelled()])
    app.add_handler(destination, show)
    runner = app.runner(concurrency=1)  # prefetch 1, or 1 + max_held if held
    running = asyncio.create_task(runner.run())
    waiting = asyncio.create_task(enough.wait())
    await asyncio.wait({running, waiting}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    runner.stop()
    await running  # a start that failed for good raises here
    if broken:
        raise broken[0]
    return shown


async def _check_queue(settings: Settings, destination: str) -> bool:
    """Fail at once on a broker that does not answer or a destination without its queue,
    before the worker's start, which retries the first and names the handler. Whether
    the destination is held (its marker, or the settings), to say so."""
    from ..amqp.connections import connect_async
    from ..amqp.passive import exchange_exists_async, queue_exists_async
    from ..core.failures import unknown_destination
    from ..errors import AccessRefusedError

    connection = await connect_async(settings, "consume")
    try:
        queue = settings.layout.work_queue(destination)
        if not await queue_exists_async(connection, queue, settings.confirm_timeout):
            raise unknown_destination(settings.layout, destination)
        if destination in settings.held_destinations:
            return True
        marker = settings.layout.held_marker(destination)
        try:
            return await exchange_exists_async(connection, marker, settings.confirm_timeout)
        except AccessRefusedError:
            return False
    finally:
        await connection.close()


def _say_waiting(queue: str, count: int | None, timeout: float | None) -> None:
    """Say on stderr what the command waits for, so a silent terminal is not a hang."""
    what = f"{count} message(s)" if count is not None else "messages"
    until = "until Ctrl-C; --timeout S stops sooner" if timeout is None else f"up to {timeout:g}s"
    err().print(f"waiting for {what} on queue {queue} ({until})", highlight=False)


def _print_message(message_id: str, body: bytes, headers: Mapping[str, Any], as_json: bool) -> None:
    from ..core.messages import DUE_AT, jsonable

    received_ms = now_ms()
    due = headers.get(DUE_AT)
    record = {
        "message_id": message_id,
        **_body_fields(body),
        "headers": jsonable(dict(headers)),
        "due_at_ms": due,
        "received_at_ms": received_ms,
        "lateness_ms": None if due is None else received_ms - int(due),
    }
    if as_json:
        print_json(record)
        return
    due_text = iso_of_ms(int(due)) if due is not None else "-"
    print(
        f"{record['message_id']}  due {due_text}  late {record['lateness_ms']} ms  "
        f"{record['body'] if record['body'] is not None else '<binary>'}",
        flush=True,
    )
