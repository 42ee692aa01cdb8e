"""The ``rmqdelay`` command: one click group, one module per command group.

Start-up time matters here (``rmqdelay --help``, one ``rmqdelay publish`` in a script):
the command modules import only click when loaded, and each command imports the broker
clients, the settings and rich when it runs. The root group imports a command's module
only when the command line names it (:class:`_LazyGroup`): loading every module took
about 30 ms of ``rmqdelay publish``'s start-up. ``rmqdelay --help`` and completion list
every command, so they load them all, in the same order as before.

The help is click's plain text: arguments listed with their help, as
:class:`~rmqdelay.cli.options.Command` does, and epilogs made by
:func:`~rmqdelay.cli.options.epilog`, so that examples stay one per line.
"""

from __future__ import annotations

import importlib

import click

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


#: command name -> (module of this package, attribute): the help lists them in this order
_COMMANDS: dict[str, tuple[str, str]] = {
    "topology": ("topology", "app"),
    "publish": ("publish", "publish"),
    "consume": ("publish", "consume"),
    "worker": ("worker", "worker_command"),
    "parked": ("parked", "app"),
    "scheduled": ("schedule", "scheduled_app"),
    "cancel": ("schedule", "cancel_command"),
    "reschedule": ("schedule", "reschedule_command"),
    "recurring": ("recurring", "app"),
    "status": ("status", "status"),
    "bridge": ("bridge", "app"),
    "dashboard": ("dashboard", "dashboard_command"),
    "move": ("move", "move_command"),
}


class _LazyGroup(Group):
    """The root group: a command's module is imported when the command is first asked
    for, so ``rmqdelay publish`` does not build the worker's or the bridge's commands."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*_COMMANDS, *(name for name in self.commands if name not in _COMMANDS)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in _COMMANDS:
            module, attribute = _COMMANDS[cmd_name]
            command = getattr(importlib.import_module(f"{__package__}.{module}"), attribute)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in _COMMANDS:  # a typo: click's "Did you mean" needs all
            for name in _COMMANDS:
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)


app = _LazyGroup(
    "rmqdelay",
    help="Exact delayed delivery on RabbitMQ with no plugin: declare, publish, consume.",
    epilog="Output: a table is drawn on a terminal; into a pipe or a file it is plain "
    "columns, and no line is wrapped or cut (FORCE_COLOR=1 draws tables anyway). --json "
    "prints a command's result as JSON: one object, or one object per line where its help "
    "says so.",
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


def main() -> None:
    """The console script ``rmqdelay`` (and ``python -m rmqdelay.cli``)."""
    app()


if __name__ == "__main__":
    main()
