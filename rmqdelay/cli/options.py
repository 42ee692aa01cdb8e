"""Options every CLI command shares, and turning errors into one clear line.

Flags win over ``RMQDELAY_*`` environment variables, which win over ``--config``.

Exit codes are the same for every command: 2 when the command line is incomplete or
contradictory (click's own checks, a missing ``--yes``, flags that exclude each other:
see :func:`usage_error`), 1 when something was refused or failed after that (settings,
values, the broker, a timeout), 130 on Ctrl-C. Never a traceback for a user's input.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import aiormq
import pika.exceptions
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from ..errors import RmqDelayError
from ..settings import Settings, load_settings

__all__ = [
    "ConfigOpt",
    "PrefixOpt",
    "UrlOpt",
    "UsageError",
    "err",
    "friendly_errors",
    "settings_from",
    "usage_error",
]

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

# emoji off: ':b:' in a user's input (worker a:b:c) must not print as an emoji
err = Console(stderr=True, soft_wrap=True, emoji=False)
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


class UsageError(Exception):
    """A command line that cannot run as typed: :func:`friendly_errors` exits 2."""


def usage_error(message: str) -> UsageError:
    """A command line that cannot run as typed (exit 2): a missing ``--yes``, flags that
    exclude each other. Values refused after reading them exit 1 instead."""
    return UsageError(message)


def friendly_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Print a user's mistake as one line naming what to fix, not a traceback.

    Exit 2 for a :func:`usage_error`, 1 for everything else a user or the broker causes.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        code = 1
        try:
            return func(*args, **kwargs)
        except UsageError as exc:
            message, code = str(exc), 2
        except ValidationError as exc:
            message = _validation_text(exc)
        except (RmqDelayError, OSError, ValueError) as exc:
            message = str(exc) or type(exc).__name__
        except (pika.exceptions.AMQPError, aiormq.exceptions.AMQPError) as exc:
            message = f"broker error: {exc!r}"
        except KeyboardInterrupt:
            err.print("interrupted", highlight=False)
            raise typer.Exit(130) from None
        err.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
        raise typer.Exit(code)

    return wrapper
