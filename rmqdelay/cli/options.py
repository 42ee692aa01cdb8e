"""Options every CLI command shares, and turning errors into one clear line.

Flags win over ``RMQDELAY_*`` environment variables, which win over ``--config``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import pika.exceptions
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from ..errors import RmqDelayError
from ..settings import Settings, load_settings

__all__ = ["ConfigOpt", "PrefixOpt", "UrlOpt", "err", "friendly_errors", "settings_from"]

UrlOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--url",
        help="AMQP URL (amqps:// for TLS); repeat it, or use commas, for a cluster's nodes. "
        "Env: RMQDELAY_URL.",
        show_default=False,
    ),
]
PrefixOpt = Annotated[
    str | None,
    typer.Option(
        "--prefix", help="Name prefix of every object. Env: RMQDELAY_PREFIX.", show_default=False
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", help="TOML file of settings (lowest priority).", show_default=False),
]

err = Console(stderr=True, soft_wrap=True)
P = ParamSpec("P")
R = TypeVar("R")


def settings_from(
    url: list[str] | None, prefix: str | None, config: Path | None, **extra: Any
) -> Settings:
    """Settings from the shared flags; ``--url`` given more than once lists the nodes."""
    return load_settings(config, url=",".join(url) if url else None, prefix=prefix, **extra)


def _validation_text(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "settings"
        lines.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
    return "invalid settings: " + "; ".join(lines)


def friendly_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Print a user's mistake as one line naming what to fix, and exit 1, not a traceback."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except ValidationError as exc:
            message = _validation_text(exc)
        except (RmqDelayError, FileNotFoundError, ValueError) as exc:
            message = str(exc)
        except pika.exceptions.AMQPError as exc:
            message = f"broker error: {exc!r}"
        err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
        raise typer.Exit(1)

    return wrapper
