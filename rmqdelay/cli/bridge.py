"""``rmqdelay bridge``: a home for the delayed-message-exchange plugin's publishers.

``declare`` makes the objects once (configure permission, and for a direct exchange the
policymaker tag); ``run`` is the long-lived process, as many as wanted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .options import (
    Group,
    broker_options,
    epilog,
    friendly_errors,
    management_url_option,
    settings_from,
)
from .worker import (
    LOG_LEVELS,
    check_logging,
    leave,
    log_format_option,
    log_level_option,
    metrics_port_option,
    run_to_end,
    serve_metrics,
    shutdown_timeout_option,
    start_logging,
)

__all__ = ["app"]

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
    "-d",
    "--destination",
    metavar="DESTINATION",
    help="The rmqdelay destination the messages wait for (default: bridge.NAME).",
)
TYPES = ("direct", "topic", "fanout", "headers")  # rmqdelay.bridge.names.EXCHANGE_TYPES


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
@management_url_option("for a direct exchange's policy and to list what is bound to NAME")
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
    from ..bridge.declare import declare_bridge
    from ..bridge.names import bridge_names

    settings = settings_from(url, prefix, config, management_url=management_url)
    names = bridge_names(
        settings.layout, exchange, delivery_exchange=delivery_exchange, destination=destination
    )
    declared = declare_bridge(settings, names, exchange_type)
    for line in declared.describe():
        click.echo(line)
    for warning in declared.warnings:
        click.echo(f"warning: {warning}", err=True)


@app.command(
    "run",
    epilog=epilog(
        "Takes messages from the inbox, holds each in the delay tiers for its x-delay (acked "
        "once confirmed there and in the schedule journal: `scheduled list` and `cancel` see "
        "them), then publishes it to DNAME with its routing key, body, headers (no x-delay) "
        "and properties. Run several for throughput and failover. SIGTERM stops taking "
        "messages and lets those in hand finish. On a machine it shares with the broker, "
        "run it under `nice -n 10`: it waits on the broker for every message, and yielding "
        "it the CPU makes every message less late (README, 'The x-delay bridge').",
        "rmqdelay bridge run --exchange orders",
        "rmqdelay bridge run --exchange orders --metrics-port 9101",
        "nice -n 10 rmqdelay bridge run --exchange orders",
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
    "--inbox-process/--inbox-thread",
    default=True,
    help="Take the inbox in a process of its own (the default), or in a thread beside "
    "the delivery to DNAME (one process, one core's share: slower when busy).",
)
@log_level_option("WARNING", f"One of {', '.join(LOG_LEVELS)}; INFO logs every message delivered.")
@log_format_option
@shutdown_timeout_option("Seconds in-flight messages get to finish.")
@metrics_port_option
@broker_options
def bridge_run(exchange: str, **options: Any) -> None:
    """Run the bridge until SIGTERM; several may run at once."""
    leave(_run_bridge(exchange, **options))


@friendly_errors
def _run_bridge(
    exchange: str,
    *,
    delivery_exchange: str | None,
    destination: str | None,
    concurrency: int,
    inbox_prefetch: int,
    inbox_process: bool,
    log_level: str,
    log_format: str,
    shutdown_timeout: float,
    metrics_port: int | None,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> int | None:
    """Run the bridge; an exit code to leave with at once, or None for a clean 0."""
    check_logging(log_level, log_format)
    from ..bridge.app import Bridge
    from ..bridge.declare import check_declared

    settings = settings_from(url, prefix, config)
    start_logging(log_level, log_format, settings)
    bridge = Bridge(
        settings,
        exchange,
        delivery_exchange=delivery_exchange,
        destination=destination,
        inbox_prefetch=inbox_prefetch,
        inbox_process=inbox_process,
        log_setup=(log_level, log_format),
    )
    check_declared(settings, bridge.names)
    serve_metrics(metrics_port, settings)
    # prefetch: the worker's, concurrency, and as much again as it may hold (max_held)
    runner = bridge.runner(concurrency=concurrency, shutdown_timeout=shutdown_timeout)
    return run_to_end(runner)
