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
"""

from __future__ import annotations

import typer

from . import parked, publish, schedule, status, topology, worker

__all__ = ["app", "main"]

app = typer.Typer(
    name="rmqdelay",
    help="Exact delayed delivery on RabbitMQ with no plugin: declare, publish, consume.",
    no_args_is_help=True,
    rich_markup_mode=None,
    # as wide as the terminal up to 100 columns (click's default stops at 80)
    context_settings={"max_content_width": 100},
)
app.add_typer(topology.app, name="topology")
app.add_typer(publish.commands)
app.add_typer(worker.commands)
app.add_typer(parked.app, name="parked")
app.add_typer(schedule.scheduled_app, name="scheduled")
app.add_typer(schedule.commands)
app.add_typer(status.commands)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
