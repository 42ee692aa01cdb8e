"""``rmqdelay bridge``: a home for the delayed-message-exchange plugin's publishers.

``declare`` makes the objects once (configure permission, and for a direct exchange the
policymaker tag); ``run`` is the long-lived process, as many as wanted.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .options import Group, broker_options, epilog, friendly_errors, settings_from
from .worker import LOG_LEVELS

if TYPE_CHECKING:
    from ..settings import Settings
    from ..worker.bridge import Bridge

__all__ = ["app"]

log = logging.getLogger("rmqdelay.cli")

app = Group(
    "bridge",
    help="Take x-delay messages sent to an exchange, as the delayed-message plugin did.",
    no_args_is_help=True,
)

_exchange = click.option(
    "-e",
    "--exchange",
    required=True,
    metavar="NAME",
    help="The exchange publishers send to, with the x-delay header (milliseconds).",
)
_delivery = click.option(
    "--delivery-exchange",
    metavar="DNAME",
    help="Where messages come out when due; bind consumers' queues here (default: NAME.delayed).",
)
_destination = click.option(
    "--destination",
    metavar="DESTINATION",
    help="The rmqdelay destination the messages wait for (default: bridge.NAME).",
)
TYPES = ("direct", "topic", "fanout", "headers")


@app.command(
    "declare",
    epilog=epilog(
        "Declares NAME and DNAME (durable, of --type), the inbox queue every message sent to "
        "NAME reaches, and the delay topology of the bridge's destination. A direct NAME "
        "gets an alternate-exchange policy (through the management API). Idempotent. Warns "
        "about queues still bound to NAME: they would get every message at once.",
        "rmqdelay bridge declare --exchange orders --type direct",
        "rmqdelay bridge declare --exchange events --type topic --delivery-exchange events.due",
    ),
)
@_exchange
@click.option(
    "--type",
    "exchange_type",
    required=True,
    type=click.Choice(TYPES),
    help="The x-delayed-type the publishers declared.",
)
@_delivery
@_destination
@broker_options
@click.option(
    "--management-url",
    metavar="URL",
    help="Management API (for the direct type's policy and the bindings check). "
    "Env: RMQDELAY_MANAGEMENT_URL.",
)
@friendly_errors
def bridge_declare(
    exchange: str,
    exchange_type: str,
    delivery_exchange: str | None,
    destination: str | None,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
    management_url: str | None,
) -> None:
    """Declare the bridge's exchanges, inbox and delay topology."""
    from ..amqp.bridge import declare_bridge
    from ..core.bridge import bridge_names

    settings = settings_from(url, prefix, config, management_url=management_url)
    names = bridge_names(
        settings.layout, exchange, delivery_exchange=delivery_exchange, destination=destination
    )
    declared = declare_bridge(settings, names, exchange_type)
    click.echo(
        f"publishers send to {names.exchange!r} ({exchange_type}, x-delay in ms); "
        f"bind consumers' queues to {names.delivery_exchange!r}"
    )
    click.echo(f"inbox {names.inbox!r}, destination {names.destination!r}")
    for note in declared.notes:
        click.echo(note)
    for warning in declared.warnings:
        click.echo(f"warning: {warning}", err=True)


@app.command(
    "run",
    epilog=epilog(
        "Takes messages from the inbox, holds each in the delay tiers for its x-delay (acked "
        "once confirmed there and in the schedule journal: `scheduled list` and `cancel` see "
        "them), then publishes it to DNAME with its routing key, body, headers (no x-delay) "
        "and properties. Run several for throughput and failover. SIGTERM stops taking "
        "messages and lets those in hand finish.",
        "rmqdelay bridge run --exchange orders",
        "rmqdelay bridge run --exchange orders --metrics-port 9101",
    ),
)
@_exchange
@_delivery
@_destination
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(1, 10_000),
    default=64,
    metavar="N",
    help="Due messages published to DNAME at once.",
)
@click.option(
    "--inbox-prefetch",
    type=click.IntRange(1, 65_535),
    default=1000,
    metavar="N",
    help="Inbox messages held unacked at once (scheduled in batches of up to 500).",
)
@click.option(
    "--log-level",
    default="WARNING",
    metavar="LEVEL",
    help=f"One of {', '.join(LOG_LEVELS)}; INFO logs every message delivered.",
)
@click.option("--log-format", default="text", metavar="FORMAT", help="text (key=value) or json.")
@click.option(
    "--shutdown-timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    metavar="SECONDS",
    help="Seconds in-flight messages get to finish.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65_535),
    metavar="PORT",
    help="Serve Prometheus metrics on this port.",
)
@broker_options
def bridge_run(exchange: str, **options: Any) -> None:
    """Run the bridge until SIGTERM; several may run at once."""
    code = _run_bridge(exchange, **options)
    if code is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def _check(settings: Settings, bridge: Bridge) -> None:
    """Name every object ``bridge declare`` makes that is missing, before the worker
    starts (its own check would name only the work queue, and the wrong command). A
    broker that cannot be reached yet is left to the worker, which retries."""
    from ..amqp.bridge import missing_objects
    from ..errors import ConnectionFailedError, WorkerError

    try:
        missing = missing_objects(settings, bridge.names)
    except ConnectionFailedError as exc:
        if not exc.transient:
            raise
        return
    if missing:
        names = bridge.names
        raise WorkerError(
            f"the bridge for {names.exchange!r} is not declared ({', '.join(missing)} "
            f"missing): run `rmqdelay bridge declare --exchange {names.exchange} --type TYPE`"
            + (
                f" --delivery-exchange {names.delivery_exchange}"
                if names.delivery_exchange != names.exchange + ".delayed"
                else ""
            )
        )


@friendly_errors
def _run_bridge(
    exchange: str,
    *,
    delivery_exchange: str | None,
    destination: str | None,
    concurrency: int,
    inbox_prefetch: int,
    log_level: str,
    log_format: str,
    shutdown_timeout: float,
    metrics_port: int | None,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> int | None:
    """Run the bridge; an exit code to leave with at once, or None for a clean 0."""
    from .options import usage_error

    if log_format not in ("text", "json"):
        raise usage_error(f"bad --log-format {log_format!r}: use text or json")
    if log_level.upper() not in LOG_LEVELS:
        raise usage_error(f"bad --log-level {log_level!r}: use one of {', '.join(LOG_LEVELS)}")
    from ..worker.bridge import Bridge
    from ..worker.logs import configure_logging

    settings = settings_from(url, prefix, config)
    configure_logging(
        log_level,
        "json" if log_format == "json" else "text",
        settings.url,
        settings.management_url,
    )
    bridge = Bridge(
        settings,
        exchange,
        delivery_exchange=delivery_exchange,
        destination=destination,
        inbox_prefetch=inbox_prefetch,
    )
    _check(settings, bridge)
    if metrics_port is not None:
        from ..amqp.status import gather_status
        from ..worker.metrics import refresh_queue_gauges, serve_metrics

        serve_metrics(metrics_port)
        log.info("serving Prometheus metrics on port %d", metrics_port)
        refresh_queue_gauges(
            lambda: gather_status(settings, journal_oldest=False), 15.0, threading.Event()
        )
    runner = bridge.runner(
        concurrency=concurrency, prefetch=concurrency, shutdown_timeout=shutdown_timeout
    )

    import asyncio

    code = asyncio.run(runner.run_until_signalled())
    if code == 0 and not runner.abandoned:
        return None
    return code or 1
