"""Options every CLI command shares, the click classes of its help, and turning errors
into one clear line.

Flags win over ``RMQDELAY_*`` environment variables, which win over ``--config``: the
settings read the environment (no click ``envvar``), so a flag left out falls through.

Exit codes are the same for every command: 2 when the command line is incomplete or
contradictory (click's own checks, a missing ``--yes``, flags that exclude each other:
see :func:`usage_error`), 1 when something was refused or failed after that (settings,
values, the broker, a timeout), 130 on Ctrl-C. Never a traceback for a user's input.

Start-up time: this module and every command module import only click at import time.
The settings, the broker clients and rich are imported inside the commands
that use them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import click
from click.exceptions import Exit

from ..errors import RmqDelayError
from .output import JSON_LINES, JSON_OBJECT, err

if TYPE_CHECKING:
    from datetime import datetime

    from ..settings import Settings

__all__ = [
    "Alias",
    "Argument",
    "Command",
    "Group",
    "UsageError",
    "argument",
    "at_option",
    "broker_options",
    "delay_option",
    "duration_us",
    "epilog",
    "friendly_errors",
    "header_pairs",
    "json_option",
    "management_url_option",
    "settings_from",
    "time_value",
    "usage_error",
]

P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])


class Argument(click.Argument):
    """A positional argument with a help text, which the command's help lists under
    "Arguments:" (click before 8.5 lists no arguments; 8.5 lists those given ``help``,
    under "Positional arguments:"). The text is kept as ``description``, not as click
    8.5's ``help``, so that the help shows it once on every click version. ``needed``:
    required, though click is told otherwise (an :class:`Alias` may give it)."""

    def __init__(
        self, param_decls: Sequence[str], description: str = "", needed: bool = False, **attrs: Any
    ) -> None:
        super().__init__(param_decls, **attrs)
        self.description = description
        self.needed = needed or self.required

    def make_metavar(self, *args: Any) -> str:
        shown = super().make_metavar(*args)
        return shown[1:-1] if self.needed and not self.required and shown[:1] == "[" else shown

    def help_row(self) -> tuple[str, str]:
        name = self.human_readable_name + ("..." if self.nargs != 1 else "")
        return name, self.description + ("  [required]" if self.needed else "")


class Alias(click.Option):
    """An old spelling of an option (or of a positional argument), kept for one release:
    hidden from the help, its value given to ``target``, with a note on stderr naming
    the new spelling. For an argument's alias, a positional value typed where the
    argument stood moves on to ``shifts`` (``recurring add NAME BODY -d DEST``)."""

    def __init__(
        self, param_decls: Sequence[str], target: str, new: str, shifts: str = "", **attrs: Any
    ) -> None:
        super().__init__(param_decls, hidden=True, **attrs)
        self.target, self.new, self.shifts = target, new, shifts

    def resolve(self, ctx: click.Context) -> None:
        value = ctx.params.pop(self.name or "", None)
        if value is None or value == ():
            return
        said = self.opts[-1]
        err().print(f"warning: {said} is deprecated, use {self.new}", highlight=False)
        given = ctx.params.get(self.target)
        if given is not None and self.shifts and ctx.params.get(self.shifts) in (None, ""):
            ctx.params[self.shifts], given = given, None
        if given is not None and given != ():
            raise click.UsageError(f"{said} and {self.new} say the same: give one", ctx)
        ctx.params[self.target] = value


class Command(click.Command):
    """A command whose help lists its arguments, each with its help text, before the
    options, and that gives its :class:`Alias` options' values to their new spelling."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [p.help_row() for p in self.get_params(ctx) if isinstance(p, Argument)]
        if rows:
            with formatter.section("Arguments"):
                formatter.write_dl(rows)
        super().format_options(ctx, formatter)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        for param in self.params:
            if isinstance(param, Alias):
                param.resolve(ctx)
        for param in self.params:
            if isinstance(param, Argument) and param.needed and ctx.params.get(param.name) is None:
                raise click.MissingParameter(ctx=ctx, param=param)
        return rest


class Group(click.Group):
    """A group that lists its commands in the order they were added (click sorts them),
    and makes its commands :class:`Command` and its subgroups :class:`Group`."""

    command_class = Command
    group_class = type  # a subgroup made with @group.group() is a Group too

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


def argument(name: str, help: str, **attrs: Any) -> Callable[[F], F]:
    """``@click.argument`` with a help text, shown under "Arguments:"."""
    return click.argument(name, cls=Argument, description=help, **attrs)


def json_option(*, lines: bool) -> Callable[[F], F]:
    """``--json``: print the result as JSON, one object or (``lines``) one per line."""
    return click.option(
        "--json", "as_json", is_flag=True, help=JSON_LINES if lines else JSON_OBJECT
    )


def delay_option(help: str) -> Callable[[F], F]:
    """``--delay DURATION``: a time from now (checked with :func:`duration_us`)."""
    return click.option("--delay", metavar="DURATION", help=f"{help}, e.g. 1.5s, 15m, 2h30m.")


def at_option(help: str) -> Callable[[F], F]:
    """``--at TIME``: a time, ISO 8601 with a timezone (read by :func:`time_value`)."""
    return click.option("--at", metavar="TIME", help=f"{help}, ISO 8601 with a timezone.")


def alias(*decls: str, target: str, new: str, shifts: str = "") -> Callable[[F], F]:
    """An old spelling of ``new`` (an option, or the argument ``target``), hidden."""
    return click.option(*decls, cls=Alias, target=target, new=new, shifts=shifts)


def header_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``-H/--header KEY=VALUE``, repeated, as a dict (a usage error naming the form)."""
    headers = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise usage_error(
                f"--header {pair!r} must look like key=value (KEY=VALUE, e.g. tenant=acme)"
            )
        headers[key] = value
    return headers


def time_value(
    text: str | None, option: str = "--at", *, or_duration: bool = False
) -> datetime | None:
    """*option*'s time (ISO 8601; with ``or_duration`` a duration from now, ``10m``, too),
    read before anything connects: a usage error naming the option otherwise (exit 2)."""
    if text is None:
        return None
    from ..core.durations import parse_time, parse_time_or_duration
    from ..errors import DelayError

    try:
        return (parse_time_or_duration if or_duration else parse_time)(text, option)
    except DelayError as exc:
        raise usage_error(str(exc)) from None


def broker_options(func: F) -> F:
    """``--url``, ``--prefix`` and ``--config``, which every command takes, in that order.

    Each is None or empty when not given, so that the ``RMQDELAY_*`` environment and then
    the config file decide (see :func:`settings_from`)."""
    for option in reversed(
        (
            click.option(
                "--url",
                multiple=True,
                metavar="URL",
                help="AMQP URL (amqps:// for TLS); repeat it, or use commas, for a cluster's "
                "nodes. Env: RMQDELAY_URL.",
            ),
            click.option(
                "--prefix",
                metavar="PREFIX",
                help="Name prefix of every object. Env: RMQDELAY_PREFIX.",
            ),
            click.option(
                "--config",
                # no existence check here: the settings say which file is missing
                type=click.Path(path_type=Path),
                help="TOML file of settings (lowest priority).",
            ),
        )
    ):
        func = option(func)
    return func


def management_url_option(what: str) -> Callable[[F], F]:
    """``--management-url``, for ``what`` the command needs the API for."""
    return click.option(
        "--management-url",
        metavar="URL",
        help=f"Management API of any node, {what}; several (commas) are tried in order "
        "(default: each AMQP host, port 15672, https for amqps). Env: RMQDELAY_MANAGEMENT_URL.",
    )


def epilog(note: str, *examples: str) -> str:
    """A command's epilog for click's plain help: *note*, wrapped to the terminal, then
    the *examples* one per line as typed (the ``\b`` line keeps click from rewrapping)."""
    parts = [note] if note else []
    if examples:
        parts.append("Examples:" if len(examples) > 1 else "Example:")
        parts.append("\b\n" + "\n".join(f"  {example}" for example in examples))
    return "\n\n".join(parts)


def settings_from(
    url: Sequence[str], prefix: str | None, config: Path | None, **extra: Any
) -> Settings:
    """Settings from the shared flags; ``--url`` given more than once lists the nodes."""
    from ..settings import load_settings

    return load_settings(config, url=",".join(url) if url else None, prefix=prefix, **extra)


def _broker_errors() -> tuple[type[BaseException], ...]:
    """The broker clients' errors, of those clients already imported (an exception of a
    client that was never imported cannot have been raised)."""
    found: list[type[BaseException]] = []
    if "pika" in sys.modules:
        import pika.exceptions

        found.append(pika.exceptions.AMQPError)
    if "aiormq" in sys.modules:
        import aiormq.exceptions

        found.append(aiormq.exceptions.AMQPError)
    return tuple(found)


def _error_text(exc: Exception) -> str | None:
    """The one line to print for an error a user or the broker caused; None for a bug."""
    if isinstance(exc, (RmqDelayError, OSError, ValueError)):
        return str(exc) or type(exc).__name__
    if isinstance(exc, _broker_errors()):
        return f"broker error: {exc!r}"
    return None


class UsageError(Exception):
    """A command line that cannot run as typed: :func:`friendly_errors` exits 2."""


def usage_error(message: str) -> UsageError:
    """A command line that cannot run as typed (exit 2): a missing ``--yes``, flags that
    exclude each other, an option's value of the wrong form or range. Values the settings
    or the broker refuse (a delay over ``max_delay``) exit 1 instead."""
    return UsageError(message)


def duration_us(text: str, option: str) -> int:
    """*option*'s duration (``--delay``) in microseconds, read before anything connects:
    one that cannot be read, or is negative, is a usage error naming the option (exit 2,
    like click's own checks of a number's type and range)."""
    from ..core.durations import parse_duration_us
    from ..errors import DelayError

    try:
        micros = parse_duration_us(text, what=option)
    except DelayError as exc:
        raise usage_error(str(exc)) from None
    if micros < 0:
        raise usage_error(f"{option} must not be negative, got {text!r}")
    return micros


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
        except KeyboardInterrupt:
            err().print("interrupted", highlight=False)
            raise Exit(130) from None
        except Exception as exc:
            text = _error_text(exc)
            if text is None:
                raise
            message = text
        from rich.markup import escape

        err().print(f"[bold red]error:[/] {escape(message)}", highlight=False)
        raise Exit(code)

    return wrapper
