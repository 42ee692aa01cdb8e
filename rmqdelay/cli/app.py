"""The ``rmqdelay`` command: one typer app, one module per command group."""

from __future__ import annotations

import typer

from . import parked, publish, schedule, status, topology, worker

__all__ = ["app", "main"]

app = typer.Typer(
    name="rmqdelay",
    help="Exact delayed delivery on RabbitMQ with no plugin: declare, publish, consume.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
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
