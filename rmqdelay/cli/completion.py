"""``rmqdelay --show-completion`` and ``--install-completion``: click's shell completion.

click completes any command line when ``_RMQDELAY_COMPLETE`` is set (``bash_source``,
``zsh_source`` or ``fish_source`` prints the script); these two flags print that script
for the user's shell, or install it where that shell reads it (the places typer used,
which the command line was built with before: ``~/.bash_completions``, ``~/.zfunc``,
fish's completions folder). The shell is the parent process (Linux), else ``$SHELL``.

The root command's flags import this module only when given (see app).
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.shell_completion import get_completion_class

__all__ = ["SHELLS", "detect_shell", "install", "install_here", "script", "show"]

SHELLS = ("bash", "zsh", "fish")


def detect_shell() -> str | None:
    """The shell running ``rmqdelay``: the parent process's name where ``/proc`` tells
    it, else the login shell of ``$SHELL``; None if neither is known."""
    try:
        parent = Path(f"/proc/{os.getppid()}/comm").read_text().strip().lstrip("-")
    except OSError:
        parent = ""
    if parent in SHELLS:
        return parent
    login = os.path.basename(os.environ.get("SHELL", ""))
    return login or None


def _names(ctx: click.Context) -> tuple[str, str]:
    """The program's name and the variable that asks it for completions."""
    prog_name = ctx.find_root().info_name or "rmqdelay"
    return prog_name, "_{}_COMPLETE".format(prog_name.replace("-", "_").upper())


def script(ctx: click.Context, shell: str) -> str:
    """click's completion script of the root command for *shell*."""
    cls = get_completion_class(shell)
    if cls is None:
        raise click.ClickException(
            f"shell {shell or 'unknown'!r} is not supported: use one of {', '.join(SHELLS)}"
        )
    prog_name, complete_var = _names(ctx)
    return cls(ctx.find_root().command, {}, prog_name, complete_var).source()


def _append_line(path: Path, line: str) -> None:
    text = path.read_text() if path.is_file() else ""
    if line not in text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{text.rstrip()}\n{line}\n".lstrip())


def install(ctx: click.Context, shell: str) -> Path:
    """Write the script where *shell* loads it; return that file."""
    source = script(ctx, shell)
    prog_name, _ = _names(ctx)
    home = Path.home()
    if shell == "bash":
        path = home / ".bash_completions" / f"{prog_name}.sh"
        _append_line(home / ".bashrc", f"source '{path}'")
    elif shell == "zsh":
        path = home / ".zfunc" / f"_{prog_name}"
        _append_line(home / ".zshrc", "fpath+=~/.zfunc; autoload -Uz compinit; compinit")
    else:
        path = home / ".config" / "fish" / "completions" / f"{prog_name}.fish"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{source}\n")
    return path


def show(ctx: click.Context) -> None:
    """``--show-completion``: print the script for the user's shell."""
    click.echo(script(ctx, detect_shell() or ""))


def install_here(ctx: click.Context) -> None:
    """``--install-completion``: install the script for the user's shell."""
    shell = detect_shell() or ""
    path = install(ctx, shell)
    click.secho(f"{shell} completion installed in {path}", fg="green")
    click.echo("Completion will take effect once you restart the terminal")
