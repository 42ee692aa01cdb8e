"""The ``rmqdelay`` command line as click builds it: its commands and options, what a
command receives, its help, exit codes and shell completion. No broker: nothing here
gets as far as connecting.

The tables are the command line as it was under typer (``rmqdelay <cmd> --help``), which
the move to click kept: a change to them is a change to the command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from rmqdelay.cli import app, completion

SHARED = ["--url", "--prefix", "--config"]
DESTINATIONS = ["-d/--destination"]
# command -> its parameters in help order: arguments by NAME, options by their flags
COMMAND_LINE: dict[str, list[str]] = {
    "": ["--install-completion", "--show-completion"],
    "topology": [],
    "topology plan": [*DESTINATIONS, *SHARED, "--show-ok/--no-show-ok", "--management-url"],
    "topology apply": [*DESTINATIONS, *SHARED],
    "topology verify": [*DESTINATIONS, *SHARED, "--management-url"],
    "topology destroy": [
        "--yes",
        "--force/--no-force",
        *DESTINATIONS,
        *SHARED,
        "--management-url",
    ],
    "publish": [
        "DESTINATION",
        "BODY",
        "--delay",
        "--at",
        "-H/--header",
        "--message-id",
        "--json",
        "--key",
        "--on-conflict",
        *SHARED,
    ],
    "consume": ["DESTINATION", "--count", "--timeout", "--json", *SHARED],
    "worker": [
        "MODULE:ATTR",
        "-c/--concurrency",
        "--prefetch",
        "-Q/--queues",
        "--log-level",
        "--log-format",
        "--shutdown-timeout",
        "--consumer-timeout",
        "--metrics-port",
        *SHARED,
    ],
    "parked": [],
    "parked list": [*DESTINATIONS, "--json", "--limit", *SHARED],
    "parked replay": [*DESTINATIONS, "--delay", "--limit", *SHARED],
    "parked purge": ["--yes", *DESTINATIONS, *SHARED],
    "scheduled": [],
    "scheduled list": [*DESTINATIONS, "--due-before", "--limit", "--key", "--json", *SHARED],
    "scheduled checkpoint": ["--json", *SHARED],
    "cancel": ["MESSAGE_IDS", "--key", "--json", *SHARED],
    "reschedule": ["ID_OR_KEY", "--in", "--at", "--json", *SHARED],
    "status": [
        *DESTINATIONS,
        "--json",
        "--prometheus",
        "--watch",
        "--amqp-only",
        "--parked-by-destination",
        "--parked-limit",
        "--recurring",
        "--check",
        "--stuck-after",
        *SHARED,
    ],
    "bridge": [],
    "bridge declare": [
        "-e/--exchange",
        "--type",
        "--delivery-exchange",
        "--destination",
        *SHARED,
        "--management-url",
    ],
    "bridge run": [
        "-e/--exchange",
        "--delivery-exchange",
        "--destination",
        "-c/--concurrency",
        "--inbox-prefetch",
        "--inbox-process/--inbox-thread",
        "--log-level",
        "--log-format",
        "--shutdown-timeout",
        "--metrics-port",
        *SHARED,
    ],
    "recurring": [],
    "recurring add": [
        "NAME",
        "BODY",
        *DESTINATIONS,
        "--cron",
        "--tz",
        "--every",
        "--first-at",
        "-H/--header",
        "--json",
        *SHARED,
    ],
    "recurring pause": ["NAME", "--json", *SHARED],
    "recurring resume": ["NAME", "--json", *SHARED],
    "recurring remove": ["NAME", "--json", *SHARED],
    "recurring list": ["--json", *SHARED],
    "dashboard": [
        "--host",
        "--port",
        "--token",
        "--read-only",
        "--worker-metrics",
        "--state",
        *SHARED,
    ],
}
# the commands of each group, in the order the help lists them
GROUPS = {
    "": [
        "topology",
        "publish",
        "consume",
        "worker",
        "parked",
        "scheduled",
        "cancel",
        "reschedule",
        "recurring",
        "status",
        "bridge",
        "dashboard",
    ],
    "topology": ["plan", "apply", "verify", "destroy"],
    "parked": ["list", "replay", "purge"],
    "scheduled": ["list", "checkpoint"],
    "bridge": ["declare", "run"],
    "recurring": ["add", "pause", "resume", "remove", "list"],
}


def _walk(command: click.Command, path: str = "") -> dict[str, click.Command]:
    """Every command under *command*, found as click finds them (the root group loads
    its commands on demand, so ``commands`` holds only those asked for)."""
    found = {path: command}
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            found.update(_walk(sub, f"{path} {name}".strip()))
    return found


COMMANDS = _walk(app)


def _declared(param: click.Parameter) -> str:
    if isinstance(param, click.Argument):
        return param.human_readable_name
    return "/".join([*param.opts, *param.secondary_opts])


def test_every_command_takes_the_same_arguments_and_options_as_before() -> None:
    found = {
        path: [_declared(p) for p in command.params if p.name != "help"]
        for path, command in COMMANDS.items()
    }
    assert found == COMMAND_LINE


def test_groups_list_their_commands_in_the_order_they_were_added() -> None:
    for path, names in GROUPS.items():
        group = COMMANDS[path]
        assert isinstance(group, click.Group)
        assert group.list_commands(click.Context(group)) == names


def _params(path: str, *args: str) -> dict[str, Any]:
    """What the command at *path* would be called with for *args* (it does not run)."""
    command = COMMANDS[path]
    with command.make_context(path, list(args)) as ctx:
        return ctx.params


def test_a_command_receives_defaults_and_repeated_options() -> None:
    assert _params("publish", "jobs", "--delay", "1s", "-H", "a=1", "--header", "b=2") == {
        "destination": "jobs",
        "body": "",
        "delay": "1s",
        "at": None,
        "header": ("a=1", "b=2"),
        "message_id": None,
        "as_json": False,
        "key": None,
        "on_conflict": None,
        "url": (),
        "prefix": None,
        "config": None,
    }
    worker = _params("worker", "tasks:app", "--url", "amqp://a", "--url", "amqp://b")
    assert worker == {
        "app_path": "tasks:app",
        "concurrency": 8,
        "prefetch": None,
        "queues": None,
        "log_level": "INFO",
        "log_format": "text",
        "shutdown_timeout": 30.0,
        "consumer_timeout": None,
        "metrics_port": None,
        "url": ("amqp://a", "amqp://b"),
        "prefix": None,
        "config": None,
    }
    status = _params("status", "-d", "a", "-d", "b", "--config", "missing.toml")
    assert status["destination"] == ("a", "b") and status["parked_limit"] == 10_000
    assert status["config"] == Path("missing.toml")  # no existence check: the settings say
    assert _params("parked list")["limit"] == 100
    assert _params("topology destroy", "--yes", "--force")["force"] is True
    assert _params("cancel", "a", "b")["message_ids"] == ("a", "b")


def _invoke(*args: str, **kwargs: Any) -> click.testing.Result:
    return CliRunner().invoke(app, list(args), prog_name="rmqdelay", **kwargs)


@pytest.mark.parametrize(
    "args",
    [
        [],  # the help, as a usage error
        ["parked"],
        ["topology"],
        ["scheduled"],
        ["nope"],
        ["publish"],
        ["publish", "jobs"],  # neither --delay nor --at: usage_error
        ["publish", "jobs", "--delay", "1s", "--at", "2026-01-01T00:00:00Z"],
        ["worker", "tasks:app", "--concurrency", "0"],
        ["worker", "tasks:app", "--log-format", "xml"],
        ["status", "--parked-limit", "65536"],
        ["consume", "jobs", "--timeout", "-1"],
        ["parked", "purge"],  # no --yes
        ["topology", "destroy"],
        ["cancel"],
        ["status", "--json=1"],
    ],
)
def test_a_command_line_that_cannot_run_exits_2(args: list[str]) -> None:
    result = _invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["publish", "jobs", "x", "--delay", "-5s"], "--delay must not be negative, got '-5s'"),
        (["publish", "jobs", "x", "--delay", "500y"], "cannot read --delay '500y': use a number"),
        (["publish", "jobs", "x", "--delay", "nan"], "--delay must be finite, got 'nan'"),
        (["publish", "jobs", "x", "--at", "soon"], "--at 'soon' is not ISO 8601"),
        (["publish", "jobs", "x", "--at", "2030-01-01"], "--at '2030-01-01' has no timezone"),
        (["publish", "jobs", "x", "--delay", "1s", "-H", "nokey"], "--header 'nokey' must look"),
        (["parked", "replay", "--delay", "soon"], "cannot read --delay 'soon'"),
        (["parked", "replay", "--delay", "-1s"], "--delay must not be negative, got '-1s'"),
        (["scheduled", "list", "--due-before", "soon"], "--due-before 'soon' is neither"),
        (["status", "--check", "--stuck-after", "-1s"], "--stuck-after must not be negative"),
    ],
)
def test_an_option_value_of_the_wrong_form_or_range_exits_2_naming_it(
    args: list[str], said: str
) -> None:
    # refused before anything connects: the URL leads nowhere, and is never tried
    result = _invoke(*args, env={"RMQDELAY_URL": "amqp://guest:guest@127.0.0.1:1/%2F"})
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {said}"), result.output
    assert result.output.count("\n") == 1, result.output


def test_a_refused_value_exits_1_with_one_line() -> None:
    result = _invoke("publish", "jobs", "not json", "--json", "--delay", "1s")
    assert result.exit_code == 1
    assert result.output == (
        "error: --json was given but the body is not JSON: Expecting value: line 1 column 1 "
        "(char 0)\n"
    )


def test_the_help_lists_arguments_with_their_help_and_examples_one_per_line() -> None:
    result = _invoke("publish", "--help", terminal_width=100)
    assert result.exit_code == 0
    assert "Usage: rmqdelay publish [OPTIONS] DESTINATION [BODY]\n" in result.output
    assert (
        "Arguments:\n"
        "  DESTINATION  The destination (work queue name).  [required]\n"
        "  BODY         The body; '-' reads standard input.\n"
    ) in result.output
    assert "  -H, --header KEY=VALUE  k=v; repeat.\n" in result.output
    assert (
        "  Examples:\n\n"
        "    rmqdelay publish orders-timeout '{\"order\": 42}' --json --delay 15m\n"
        "    echo hi | rmqdelay publish emails - --at 2026-12-01T09:00:00Z\n"
        "    rmqdelay publish reminders hi --delay 1h --key order-42 --on-conflict ignore\n"
    ) in result.output
    worker = _invoke("worker", "--help", terminal_width=100).output
    assert "[default: 8; 1<=x<=10000]" in worker
    assert "  MODULE:ATTR  The rmqdelay.Worker to run, e.g. tasks:app.  [required]\n" in worker
    destroy = _invoke("topology", "destroy", "--help", terminal_width=100).output
    assert "--force / --no-force" in destroy and "[default: no-force]" in destroy


@pytest.mark.parametrize(("columns", "widest"), [(60, 58), (200, 98)])
def test_the_help_is_as_wide_as_the_terminal_up_to_100_columns(columns: int, widest: int) -> None:
    """In a process of its own: click's test runner makes every help 80 columns wide."""
    done = subprocess.run(
        [sys.executable, "-m", "rmqdelay.cli", "status", "--help"],
        env={**os.environ, "COLUMNS": str(columns)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert max(len(line) for line in done.stdout.splitlines()) == widest


@pytest.fixture
def bash(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The user's shell is bash and their home *tmp_path*."""
    monkeypatch.setattr(completion, "detect_shell", lambda: "bash")
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_show_completion_prints_clicks_script_for_the_shell(bash: Path) -> None:
    result = _invoke("--show-completion")
    assert result.exit_code == 0
    assert "_RMQDELAY_COMPLETE=bash_complete" in result.output
    assert "complete -o nosort -F _rmqdelay_completion rmqdelay" in result.output


def test_install_completion_writes_the_script_and_sources_it_once(bash: Path) -> None:
    for _ in range(2):
        result = _invoke("--install-completion")
        assert result.exit_code == 0, result.output
    script = bash / ".bash_completions" / "rmqdelay.sh"
    assert f"bash completion installed in {script}" in result.output
    assert "_RMQDELAY_COMPLETE=bash_complete" in script.read_text()
    assert (bash / ".bashrc").read_text() == f"source '{script}'\n"


def test_an_unsupported_shell_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(completion, "detect_shell", lambda: "tcsh")
    result = _invoke("--show-completion")
    assert result.exit_code == 1
    assert "shell 'tcsh' is not supported: use one of bash, zsh, fish" in result.output


def test_the_completion_script_gets_completions() -> None:
    env = {"_RMQDELAY_COMPLETE": "bash_complete", "COMP_WORDS": "rmqdelay pa", "COMP_CWORD": "1"}
    result = _invoke(env=env)
    assert result.exit_code == 0
    assert result.output.splitlines() == ["plain,parked"]
    env = {**env, "COMP_WORDS": "rmqdelay worker x --log-f", "COMP_CWORD": "3"}
    assert _invoke(env=env).output.splitlines() == ["plain,--log-format"]


def test_a_mistyped_command_gets_clicks_suggestion() -> None:
    """The root group loads its commands on demand; a name it does not know still gets
    click's "Did you mean", which needs every command's name."""
    result = CliRunner().invoke(app, ["publsh", "jobs"])
    assert result.exit_code == 2
    assert "No such command 'publsh'. Did you mean 'publish'?" in result.output
