"""``rmqdelay worker``: load a :class:`~rmqdelay.Worker` app and run it."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import click

from ..errors import WorkerError
from .options import (
    Command,
    argument,
    broker_options,
    epilog,
    friendly_errors,
    settings_from,
    usage_error,
)

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:
    from ..settings import Settings
    from ..worker.app import Worker
    from ..worker.runner import RunningWorker

__all__ = [
    "check_logging",
    "leave",
    "load_worker",
    "run_to_end",
    "serve_metrics",
    "start_logging",
    "worker_command",
]

# The worker (aio-pika, pydantic, the settings) is imported when the command runs, not
# for ``rmqdelay --help``: see options.
log = logging.getLogger("rmqdelay.cli")
# rmqdelay.worker.logs.LEVELS, spelled out for the help text (a unit test keeps them equal)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

WORKER_EPILOG = epilog(
    "Async handlers run as asyncio tasks, sync ones in a thread pool; --concurrency bounds "
    "both. SIGTERM or Ctrl-C stops consuming and waits for in-flight handlers "
    "(--shutdown-timeout); a second signal stops at once, and the unacked messages go back "
    "to their queues.",
    "rmqdelay worker myapp.tasks:app",
    "rmqdelay worker myapp.tasks:app --concurrency 16 --prefetch 32",
    "rmqdelay worker myapp.tasks:app --queues orders-timeout,invoices --log-level DEBUG",
    "RMQDELAY_URL=amqps://user:pass@broker/%2F rmqdelay worker myapp.tasks:app --metrics-port 9100",
)


def log_level_option(default: str, help: str) -> Callable[[F], F]:
    return click.option("--log-level", default=default, metavar="LEVEL", help=help)


log_format_option = click.option(
    "--log-format", default="text", metavar="FORMAT", help="text (key=value) or json."
)
metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(1, 65_535),
    metavar="PORT",
    help="Serve Prometheus metrics on this port.",
)


def shutdown_timeout_option(help: str) -> Callable[[F], F]:
    return click.option(
        "--shutdown-timeout",
        type=click.FloatRange(min=0),
        default=30.0,
        metavar="SECONDS",
        help=help,
    )


class AppLoadError(WorkerError):
    """``module:attr`` does not name a Worker."""


def load_worker(path: str) -> Worker:
    """Import ``module:attr`` (or a module holding exactly one Worker) from the cwd too."""
    from ..worker.app import Worker

    module_name, _, attr = path.partition(":")
    if not module_name or (":" in path and not attr):
        raise AppLoadError(f"cannot read {path!r}: give the worker as module:attr, e.g. tasks:app")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise AppLoadError(
                f"cannot import module {module_name!r} (from {path!r}): no module named "
                f"{exc.name!r}; run from the project's directory or set PYTHONPATH"
            ) from None
        raise AppLoadError(
            f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    except Exception as exc:
        raise AppLoadError(
            f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    workers = sorted(k for k, v in vars(module).items() if isinstance(v, Worker))
    if not attr:
        if len(workers) != 1:
            found = ", ".join(workers) or "none"
            raise AppLoadError(
                f"module {module_name!r} holds {len(workers)} Worker objects ({found}): "
                f"name one, as {module_name}:ATTR"
            )
        attr = workers[0]
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            hint = f"; Worker objects in it: {', '.join(workers)}" if workers else ""
            raise AppLoadError(f"module {module_name!r} has no attribute {attr!r}{hint}")
        target = getattr(target, part)
    if not isinstance(target, Worker):
        raise AppLoadError(
            f"{module_name}:{attr} is a {type(target).__name__}, not an rmqdelay.Worker"
        )
    return target


def _worker_settings(
    worker: Worker, url: tuple[str, ...], prefix: str | None, config: Path | None
) -> Settings:
    if worker._settings is None:
        return settings_from(url, prefix, config)
    given = [flag for flag, v in (("--url", url), ("--prefix", prefix), ("--config", config)) if v]
    if given:
        raise WorkerError(
            f"the worker app was built with its own Settings, so {', '.join(given)} would be "
            "ignored: drop them, or build Worker() without settings to read flags and RMQDELAY_*"
        )
    return worker.settings


def _queues(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [n.strip() for n in value.split(",")]
    if not all(names):
        raise WorkerError(
            f"bad --queues {value!r}: give destination names separated by commas, "
            "e.g. --queues orders-timeout,invoices"
        )
    return names


def _describe(worker: Worker, settings: Settings, queues: list[str] | None) -> None:
    for spec in worker.select(settings, queues):
        policy = spec.policy
        log.info(
            "handler %s for %s: body %s, %s, up to %d attempts, backoff %s",
            spec.name,
            spec.destination,
            spec.body_type,
            "async" if spec.is_async else "sync (thread pool)",
            policy.max_attempts,
            policy.backoff.describe(),
        )


@click.command("worker", cls=Command, epilog=WORKER_EPILOG)
@argument("app_path", metavar="MODULE:ATTR", help="The rmqdelay.Worker to run, e.g. tasks:app.")
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(1, 10_000),
    default=8,
    metavar="N",
    help="Handlers running at once.",
)
@click.option(
    "--prefetch",
    type=click.IntRange(1, 65_535),
    metavar="N",
    help="Unacked messages per queue, held ones included (default: --concurrency; "
    "--concurrency + max_held for a held destination).",
)
@click.option(
    "-Q",
    "--queues",
    metavar="NAMES",
    help="Only these destinations, comma-separated (default: every handler's).",
)
@log_level_option("INFO", f"One of {', '.join(LOG_LEVELS)}.")
@log_format_option
@shutdown_timeout_option("Seconds in-flight handlers get to finish.")
@click.option(
    "--consumer-timeout",
    type=click.FloatRange(min=0.001, max=2**31 / 1000),
    metavar="SECONDS",
    help="Ask the broker to take a message back from a handler running this long "
    "(RabbitMQ 4.3 on quorum queues; default: the broker's consumer_timeout, 30 min).",
)
@metrics_port_option
@broker_options
def worker_command(app_path: str, **options: Any) -> None:
    """Consume work queues and run their handlers, at least once."""
    leave(_run_worker(app_path, **options))  # the options, typed, are _run_worker's


def leave(code: int | None) -> None:
    """Return for a clean 0; else flush and exit with ``code`` at once: threads of sync
    handlers that outlived the shutdown cannot be stopped."""
    if code is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def check_logging(log_level: str, log_format: str) -> None:
    """A usage error (exit 2) for a --log-level or --log-format it does not know."""
    if log_format not in ("text", "json"):
        raise usage_error(f"bad --log-format {log_format!r}: use text or json")
    if log_level.upper() not in LOG_LEVELS:
        raise usage_error(f"bad --log-level {log_level!r}: use one of {', '.join(LOG_LEVELS)}")


def start_logging(log_level: str, log_format: str, settings: Settings) -> None:
    """Log lines to stderr, every URL of the settings masked in them."""
    from ..worker.logs import configure_logging

    fmt: Literal["text", "json"] = "json" if log_format == "json" else "text"
    configure_logging(log_level, fmt, settings.url, settings.management_url)


def serve_metrics(port: int | None, settings: Settings) -> None:
    """``--metrics-port``: the worker's metrics, and the queue gauges refreshed every 15 s
    (scheduled and past-time per tier, and parked: the management API when it answers,
    as only it counts past-time messages, else passive declares)."""
    if port is None:
        return
    from ..amqp.status import gather_status
    from ..worker.metrics import refresh_queue_gauges
    from ..worker.metrics import serve_metrics as start_server

    start_server(port)
    log.info("serving Prometheus metrics on port %d", port)
    refresh_queue_gauges(
        lambda: gather_status(settings, journal_oldest=False), 15.0, threading.Event()
    )


def run_to_end(runner: RunningWorker) -> int | None:
    """Run until signalled; None for a clean 0, else the exit code to leave with."""
    import asyncio

    code = asyncio.run(runner.run_until_signalled())
    if code == 0 and not runner.abandoned:
        return None
    return code or 1


@friendly_errors
def _run_worker(
    app_path: str,
    *,
    concurrency: int,
    prefetch: int | None,
    queues: str | None,
    log_level: str,
    log_format: str,
    shutdown_timeout: float,
    consumer_timeout: float | None,
    metrics_port: int | None,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> int | None:
    """Run the worker; return an exit code to leave with at once, or None for a clean 0."""
    check_logging(log_level, log_format)
    worker = load_worker(app_path)
    settings = _worker_settings(worker, url, prefix, config)
    start_logging(log_level, log_format, settings)
    names = _queues(queues)
    _describe(worker, settings, names)
    serve_metrics(metrics_port, settings)
    runner = worker.runner(
        settings,
        concurrency=concurrency,
        prefetch=prefetch,
        queues=names,
        shutdown_timeout=shutdown_timeout,
        consumer_timeout=consumer_timeout,
    )
    return run_to_end(runner)
