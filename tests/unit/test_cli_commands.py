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
from rmqdelay.cli.output import JSON_LINES, JSON_OBJECT

SHARED = ["--url", "--prefix", "--config"]
DESTINATIONS = ["-d/--destination"]
# command -> its parameters in help order: arguments by NAME, options by their flags
COMMAND_LINE: dict[str, list[str]] = {
    "": ["--install-completion", "--show-completion"],
    "topology": [],
    "topology plan": [
        *DESTINATIONS,
        "--held",
        *SHARED,
        "--show-ok/--no-show-ok",
        "--management-url",
    ],
    "topology apply": [*DESTINATIONS, "--held", *SHARED],
    "topology verify": [*DESTINATIONS, "--held", *SHARED, "--management-url"],
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
        "--content-type",
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
    "move": ["--to", "--to-prefix", "--dry-run", "--json", *SHARED],
    "cancel": [
        "MESSAGE_IDS",
        "--key",
        *DESTINATIONS,
        "--due-before",
        "--due-after",
        "-H/--header",
        "--key-prefix",
        "--dry-run",
        "--yes",
        "--json",
        *SHARED,
    ],
    "reschedule": ["ID_OR_KEY", "--delay", "--at", "--json", *SHARED],
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
        *DESTINATIONS,
        *SHARED,
        "--management-url",
    ],
    "bridge run": [
        "-e/--exchange",
        "--delivery-exchange",
        *DESTINATIONS,
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
        "DESTINATION",
        "BODY",
        "--cron",
        "--tz",
        "--every",
        "--delay",
        "--at",
        "-H/--header",
        "--content-type",
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
        "move",
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
        path: [_declared(p) for p in command.params if p.name != "help" and not _hidden(p)]
        for path, command in COMMANDS.items()
    }
    assert found == COMMAND_LINE
    aliases = {
        path: [_declared(p) for p in command.params if _hidden(p)]
        for path, command in COMMANDS.items()
        if any(map(_hidden, command.params))
    }
    assert aliases == ALIASES


def _hidden(param: click.Parameter) -> bool:
    return isinstance(param, click.Option) and param.hidden


# the old spellings kept, hidden, for one release (0.x: drop them in the next)
ALIASES = {
    "reschedule": ["--in"],
    "recurring add": ["-d/--destination", "--first-at"],
}

# An option several commands take means one thing, spelled one way, read as one type:
# spelling -> (its parameter's name, metavar, flag, the help texts it may have). A
# command that spells the same parameter another way, or gives a spelling another
# meaning, fails here.
SHARED_OPTIONS: dict[str, tuple[str, str | None, bool, set[str] | str]] = {
    "--json": ("as_json", None, True, {JSON_OBJECT, JSON_LINES}),
    "--delay": ("delay", "DURATION", False, ", e.g. 1.5s, 15m, 2h30m."),
    "--at": ("at", "TIME", False, ", ISO 8601 with a timezone."),
    "-d/--destination": ("destination", "DESTINATION", False, ""),
    "--held": ("held", "DESTINATION", False, "; repeat for more."),
    "-H/--header": (
        "header",
        "KEY=VALUE",
        False,
        {"k=v; repeat.", "Filter: k=v (the value compared as text); repeat."},
    ),
    "--key": ("key", "KEY", False, ""),
    "--limit": ("limit", "N", False, ""),
    "--yes": ("yes", None, True, ""),
    "--content-type": ("content_type", "TYPE", False, ""),
    "--url": ("url", "URL", False, ""),
    "--prefix": ("prefix", "PREFIX", False, ""),
    "--config": ("config", None, False, ""),
    "--management-url": ("management_url", "URL", False, ""),
    "-c/--concurrency": ("concurrency", "N", False, ""),
    "--log-level": ("log_level", "LEVEL", False, ""),
    "--log-format": ("log_format", "FORMAT", False, {"text (key=value) or json."}),
    "--shutdown-timeout": ("shutdown_timeout", "SECONDS", False, ""),
    "--metrics-port": ("metrics_port", "PORT", False, {"Serve Prometheus metrics on this port."}),
}
# what --json prints on each command that has it: one object, or one object per line
# for a command that answers with several things (messages, ids, schedules)
JSON_SHAPES = {
    "publish": JSON_OBJECT,
    "consume": JSON_LINES,
    "parked list": JSON_LINES,
    "scheduled list": JSON_LINES,
    "scheduled checkpoint": JSON_OBJECT,
    "cancel": JSON_LINES,
    "move": JSON_OBJECT,
    "reschedule": JSON_OBJECT,
    "status": JSON_OBJECT,
    "recurring add": JSON_OBJECT,
    "recurring pause": JSON_OBJECT,
    "recurring resume": JSON_OBJECT,
    "recurring remove": JSON_OBJECT,
    "recurring list": JSON_LINES,
}


def test_shared_options_mean_one_thing_spelled_one_way_on_every_command() -> None:
    by_name = {name: spelling for spelling, (name, *_) in SHARED_OPTIONS.items()}
    for path, command in COMMANDS.items():
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden or param.name == "help":
                continue
            spelling = _declared(param)
            if param.name in by_name:  # the same parameter: the same spelling
                assert spelling == by_name[param.name], (path, spelling)
            spellings = {s for s in SHARED_OPTIONS if set(s.split("/")) & set(param.opts)}
            assert spellings <= {spelling}, (path, spelling)  # no spelling of another's
            if spelling not in SHARED_OPTIONS:
                continue
            name, metavar, flag, helps = SHARED_OPTIONS[spelling]
            assert (param.name, param.metavar, param.is_flag) == (name, metavar, flag), path
            assert param.help is not None, (path, spelling)
            if isinstance(helps, set):
                assert param.help in helps, (path, spelling, param.help)
            else:
                assert param.help.endswith(helps), (path, spelling, param.help)
            if spelling == "--json":
                assert param.help == JSON_SHAPES[path], path
    with_json = {p for p, c in COMMANDS.items() if any(o.name == "as_json" for o in c.params)}
    assert with_json == set(JSON_SHAPES)
    # the destination a command acts on is its first argument (after a schedule's name)
    targets = {p for p, c in COMMANDS.items() if "DESTINATION" in map(_declared, c.params)}
    assert targets == {"publish", "consume", "recurring add"}


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
        "content_type": None,
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
    result = _invoke("publish", "jobs", "not json", "--content-type", "json", "--delay", "1s")
    assert result.exit_code == 1
    assert result.output == (
        "error: --content-type json but the body is not JSON: Expecting value: line 1 "
        "column 1 (char 0)\n"
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
        "    rmqdelay publish orders-timeout '{\"order\": 42}' --delay 15m --json\n"
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


def test_an_old_spelling_still_works_for_a_release_and_says_the_new_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _params("reschedule", "order-42", "--in", "2h")["delay"] == "2h"
    assert "warning: --in is deprecated, use --delay" in capsys.readouterr().err
    # recurring add NAME BODY -d DEST (0.x): the positional after NAME was the body
    old = _params("recurring add", "poll", "ping", "-d", "poller", "--every", "15m")
    assert (old["destination"], old["body"]) == ("poller", "ping")
    assert "--destination is deprecated" in capsys.readouterr().err
    new = _params("recurring add", "poll", "poller", "ping", "--every", "15m")
    assert (new["destination"], new["body"]) == ("poller", "ping")
    assert _params("recurring add", "poll", "-d", "poller", "--first-at", "2030-01-01T00:00Z")[
        "at"
    ] == ("2030-01-01T00:00Z")
    both = _invoke("reschedule", "order-42", "--in", "2h", "--delay", "1h")
    assert both.exit_code == 2 and "--in and --delay say the same: give one" in both.output
    missing = _invoke("recurring", "add", "poll", "--every", "15m")
    assert missing.exit_code == 2 and "Missing argument 'DESTINATION'" in missing.output


def test_a_json_body_is_sent_as_json_and_said_unless_a_type_is_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from rmqdelay.cli.publish import read_body

    assert read_body('{"n": 1}', None) == ({"n": 1}, None)
    assert "the body is JSON: sent as application/json" in capsys.readouterr().err
    assert read_body('{"n": 1}', "text/plain") == ('{"n": 1}', "text/plain")
    assert read_body("42", None) == ("42", None)  # a number or a word stays text
    assert read_body("[not json", None) == ("[not json", None)
    assert read_body("42", "json") == (42, None)
    assert capsys.readouterr().err == ""


def test_a_table_into_a_pipe_is_plain_columns_never_wrapped_or_cut() -> None:
    from io import StringIO

    from rich.console import Console

    from rmqdelay.cli.output import print_table

    long = "x" * 150
    for terminal, boxes in ((False, False), (True, True)):
        file = StringIO()
        console = Console(file=file, force_terminal=terminal, width=80, soft_wrap=True)
        print_table(
            ("name", "n"),
            [(long, "1"), ("b", ("22", "red"))],
            title="T",
            caption="2 rows",
            right=("n",),
            console=console,
        )
        text = file.getvalue()
        assert ("┃" in text) is boxes
        if not terminal:
            assert text.splitlines() == [
                "T",
                f"{'name':<150}   n",
                f"{'-' * 150}  --",
                f"{long}   1",
                f"{'b':<150}  22",
                "2 rows",
            ]


def test_results_say_themselves_in_the_words_the_cli_and_the_dashboard_print() -> None:
    from rmqdelay.core.journal.recurring import RecurringResult
    from rmqdelay.core.journal.reschedule import RescheduleResult
    from rmqdelay.core.journal.view import CancelResult

    assert CancelResult("a", "cancelled", 1000, "d", 1).describe() == (
        "a: cancelled (was due 1970-01-01T00:00:01.000+00:00)"
    )
    assert CancelResult("a", "cancelled", 2000, "d", 3, (1000, 2000)).describe() == (
        "a: cancelled 2 copies (were due 1970-01-01T00:00:01.000+00:00, "
        "1970-01-01T00:00:02.000+00:00; 1 more already due)"
    )
    assert CancelResult("", "unknown", key="k").describe() == (
        "key k: unknown (no message with this key in the schedule journal)"
    )
    assert (
        CancelResult("a", "unknown").describe() == "a: unknown (no record in the schedule journal)"
    )
    moved = RescheduleResult("k", "rescheduled", "id", "k", "d", 1000, 2000)
    assert moved.describe() == (
        "k: rescheduled (id) from 1970-01-01T00:00:01.000+00:00 to "
        "1970-01-01T00:00:02.000+00:00 (the waiting copy is forwarded)"
    )
    assert RescheduleResult("x", "unknown").describe().startswith("x: unknown")
    paused = RecurringResult("poll", "paused", "every 15m", "jobs", 1000)
    assert paused.describe() == (
        "poll: paused (every 15m to jobs), next 1970-01-01T00:00:01.000+00:00: its "
        "occurrences go on, no handler runs until it is resumed"
    )


def test_read_only_is_said_one_way() -> None:
    from rmqdelay import dashboard
    from rmqdelay.cli import dashboard as command

    assert command.READ_ONLY == dashboard.READ_ONLY
    help = " ".join(_invoke("dashboard", "--help").output.split())  # unwrapped
    assert f"--read-only {dashboard.READ_ONLY}." in help
    assert f"The dashboard {dashboard.READ_ONLY}. Env: RMQDELAY_DASHBOARD_READ_ONLY." in help
