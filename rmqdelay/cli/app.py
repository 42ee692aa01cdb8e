"""The ``rmqdelay`` command: one click group, one module per command group.

Start-up time matters here (``rmqdelay --help``, one ``rmqdelay publish`` in a script):
the command modules import only click when loaded, and each command imports the broker
clients, the settings and rich when it runs. click's decorators build every command
when its module is imported, which takes a few milliseconds, so :func:`main` runs the
whole :data:`app` for any command line. (Under typer, which the CLI used before, each
run built every command from its signature, a pydantic adapter per parameter, so
``main`` built only the group a command line named.)

The help is click's plain text: arguments listed with their help, as
:class:`~rmqdelay.cli.options.Command` does, and epilogs made by
:func:`~rmqdelay.cli.options.epilog`, so that examples stay one per line.
"""

from __future__ import annotations

import click

from . import bridge, parked, publish, recurring, schedule, status, topology, worker
from .options import Group

__all__ = ["app", "main"]


def _show_completion(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from .completion import show

        show(ctx)
        ctx.exit(0)


def _install_completion(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        from .completion import install_here

        install_here(ctx)
        ctx.exit(0)


app = Group(
    "rmqdelay",
    help="Exact delayed delivery on RabbitMQ with no plugin: declare, publish, consume.",
    no_args_is_help=True,
    # as wide as the terminal up to 100 columns (click's default stops at 80); the
    # defaults of options shown, as in `[default: 8; 1<=x<=10000]`
    context_settings={"max_content_width": 100, "show_default": True},
    params=[
        click.Option(
            ["--install-completion"],
            is_flag=True,
            expose_value=False,
            is_eager=True,
            callback=_install_completion,
            help="Install completion for the current shell.",
        ),
        click.Option(
            ["--show-completion"],
            is_flag=True,
            expose_value=False,
            is_eager=True,
            callback=_show_completion,
            help="Show completion for the current shell, to copy it or customize the installation.",
        ),
    ],
)
for _command in (
    topology.app,
    publish.publish,
    publish.consume,
    worker.worker_command,
    parked.app,
    schedule.scheduled_app,
    schedule.cancel_command,
    schedule.reschedule_command,
    recurring.app,
    status.status,
    bridge.app,
):
    app.add_command(_command)


def main() -> None:
    """The console script ``rmqdelay`` (and ``python -m rmqdelay.cli``)."""
    app()


if __name__ == "__main__":
    main()
