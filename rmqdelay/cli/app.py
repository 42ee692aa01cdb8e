"""The ``rmqdelay`` command: one typer app, one module per command group.

Start-up time matters here (``rmqdelay --help``, one ``rmqdelay publish`` in a script):
the command modules import only typer when loaded, and each command imports the broker
clients, the settings and rich when it runs. The help is click's plain text
(``rich_markup_mode=None``): typer's rich help imports rich's markdown, tables and
tracebacks, about as long as the rest of ``rmqdelay --help`` together. Epilogs are made
by :func:`~rmqdelay.cli.options.epilog`, so that examples stay one per line.

The command modules do without ``from __future__ import annotations``: typer reads the
signature of every command on every run, and string annotations are compiled and
evaluated each time (about 20 ms); the few annotations naming a type imported only for
mypy are quoted instead.

For the same reason :func:`main` hands a command line that starts with a command's name
to an app of that command's group alone: typer builds every command of the app it runs
(signatures, options) before it parses anything.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import typer

from . import parked, publish, schedule, status, topology, worker

__all__ = ["app", "main"]

_SETTINGS: dict[str, Any] = {
    "name": "rmqdelay",
    "help": "Exact delayed delivery on RabbitMQ with no plugin: declare, publish, consume.",
    "no_args_is_help": True,
    "rich_markup_mode": None,
    # as wide as the terminal up to 100 columns (click's default stops at 80)
    "context_settings": {"max_content_width": 100},
}
_GROUPS: list[tuple[typer.Typer, str | None]] = [
    (topology.app, "topology"),
    (publish.commands, None),  # no name: its commands are the app's own
    (worker.commands, None),
    (parked.app, "parked"),
    (schedule.scheduled_app, "scheduled"),
    (schedule.commands, None),
    (status.commands, None),
]

app = typer.Typer(**_SETTINGS)
for _group, _name in _GROUPS:
    app.add_typer(_group, name=_name)


def _names(group: typer.Typer, name: str | None) -> set[str]:
    """What a command line starts with to reach ``group``: its name, or its commands'."""
    if name is not None:
        return {name}
    return {
        info.name or typer.main.get_command_name(info.callback.__name__)
        for info in group.registered_commands
        if info.callback is not None
    }


def app_for(args: list[str]) -> typer.Typer:
    """The app to run ``args`` with: when they start with a command's name, an app of
    that command's group alone (the same command line, help and errors, built in a
    fraction of the time); else, and for shell completion, the whole :data:`app`."""
    if not args or any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return app
    for group, name in _GROUPS:
        if args[0] in _names(group, name):
            one = typer.Typer(**_SETTINGS)
            one.add_typer(group, name=name)  # a group still: `rmqdelay status` as typed
            return one
    return app


def main() -> None:
    app_for(sys.argv[1:])()


if __name__ == "__main__":
    main()
