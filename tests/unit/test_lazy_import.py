"""``import rmqdelay`` and ``rmqdelay --help`` stay cheap: what they import, as facts.

Each check runs in a fresh interpreter (the test process has imported everything already).
No timings here: ``python -m bench startup`` measures those. Marked ``unit`` by its folder
(tests/conftest.py), like every test under tests/unit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pika.exceptions
import pytest
from click.exceptions import Exit

from rmqdelay.cli.options import epilog, friendly_errors, usage_error
from rmqdelay.settings import Settings

# heavy modules that ``import rmqdelay`` and ``rmqdelay --help`` must leave alone
HEAVY = ("aio_pika", "aiormq", "rmqdelay.worker", "pydantic_settings")
# ... and that the help of the command line, and the command line itself, leave alone too:
# the CLI is click's; typer, which it was built with before, imported pydantic for its
# option parsing on every run
HELP_HEAVY = (*HEAVY, "pika", "rich", "pydantic", "pydantic_core", "rmqdelay.settings", "typer")


def _run(code: str) -> Any:
    """Run *code* in a fresh interpreter; it prints one JSON document, returned here."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_rmqdelay_leaves_aio_pika_and_the_worker_out() -> None:
    loaded = _run(
        f"""
        import json, sys
        import rmqdelay
        print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))
        """
    )
    assert loaded == []


def test_touching_a_name_imports_what_it_needs() -> None:
    found = _run(
        """
        import json, sys
        import rmqdelay
        before = "aio_pika" in sys.modules
        cls = rmqdelay.AsyncPublisher
        from rmqdelay.amqp.aio_publisher import AsyncPublisher
        print(json.dumps({
            "before": before,
            "after": "aio_pika" in sys.modules,
            "same": cls is AsyncPublisher,
            "kept": "AsyncPublisher" in vars(rmqdelay),
            "worker": "rmqdelay.worker" in sys.modules,
        }))
        """
    )
    assert found == {"before": False, "after": True, "same": True, "kept": True, "worker": False}


def test_every_name_of_all_resolves() -> None:
    found = _run(
        """
        import json
        import rmqdelay
        names = list(rmqdelay.__all__)
        missing = [n for n in names if getattr(rmqdelay, n, None) is None]
        from rmqdelay import *  # noqa: F403  (the star import resolves __all__ too)
        print(json.dumps({
            "names": names,
            "missing": missing,
            "not_in_dir": sorted(set(names) - set(dir(rmqdelay))),
        }))
        """
    )
    assert found["missing"] == [] and found["not_in_dir"] == []
    assert len(found["names"]) == len(set(found["names"])) > 30


def test_the_names_are_the_defining_modules_objects() -> None:
    import rmqdelay
    from rmqdelay.amqp.publisher import Publisher
    from rmqdelay.errors import RmqDelayError
    from rmqdelay.settings import Settings
    from rmqdelay.worker import Worker

    assert rmqdelay.Publisher is Publisher and rmqdelay.Settings is Settings
    assert rmqdelay.Worker is Worker and rmqdelay.RmqDelayError is RmqDelayError
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        rmqdelay.Nope  # noqa: B018


def test_the_cli_app_and_its_help_leave_the_broker_clients_out() -> None:
    found = _run(
        f"""
        import json, sys
        from rmqdelay.cli.app import main  # the module rmqdelay (the console script) runs
        after_import = [m for m in {HELP_HEAVY!r} if m in sys.modules]
        sys.argv = ["rmqdelay", "--help"]
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        after_help = [m for m in {HELP_HEAVY!r} if m in sys.modules]
        print(json.dumps({{"import": after_import, "help": after_help, "code": code}}))
        """
    )
    assert found == {"import": [], "help": [], "code": 0}


@pytest.mark.parametrize(
    "command",
    [
        "worker",
        "publish",
        "consume",
        "status",
        "cancel",
        "scheduled list",
        "parked list",
        "parked replay",
        "parked purge",
        "topology plan",
        "topology apply",
        "topology verify",
        "topology destroy",
    ],
)
def test_a_commands_help_does_not_import_its_dependencies(command: str) -> None:
    found = _run(
        f"""
        import json, sys
        from rmqdelay.cli import main
        sys.argv = ["rmqdelay", *{command.split()!r}, "--help"]
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        print(json.dumps({{"loaded": [m for m in {HELP_HEAVY!r} if m in sys.modules],
                          "code": code}}))
        """
    )
    assert found == {"loaded": [], "code": 0}


@pytest.mark.parametrize(
    "extra_env",
    [{}, {"RMQDELAY_NAMED_TIERS": '["1h"]'}],
    ids=["plain settings", "a list in the environment"],
)
def test_a_publish_run_imports_the_publisher_and_never_pydantic(extra_env: dict[str, str]) -> None:
    """``rmqdelay publish`` up to the connection (refused: a port nothing listens on)
    loads pika, which it needs, and the settings, and no typer, aio-pika, worker or other
    command. The settings are read without pydantic, a list in the environment too."""
    found = _run(
        f"""
        import json, os, socket, sys
        with socket.socket() as sock:  # a free port, closed again: connection refused
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ["RMQDELAY_URL"] = f"amqp://guest:guest@127.0.0.1:{{port}}/%2F"
        os.environ.update({extra_env!r})
        from rmqdelay.cli import main
        sys.argv = ["rmqdelay", "publish", "jobs", "hi", "--delay", "1s"]
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        print(json.dumps({{
            "code": code,
            "loaded": [m for m in {(*HELP_HEAVY, "rmqdelay.cli.worker", "rmqdelay.cli.bridge")!r}
                       if m in sys.modules],
        }}))
        """
    )
    assert found["code"] == 1  # cannot connect
    loaded = set(found["loaded"])
    assert "pika" in loaded
    assert "rmqdelay.settings" in loaded
    assert not {"pydantic", "pydantic_core", "pydantic_settings"} & loaded
    assert not {"typer", "aio_pika", "aiormq", "rmqdelay.worker"} & loaded
    assert not {"rmqdelay.cli.worker", "rmqdelay.cli.bridge"} & loaded


def test_a_scheduled_list_run_reads_without_pydantic_the_publisher_or_a_progress() -> None:
    """``rmqdelay scheduled list --json`` up to the connection (refused) reads its
    settings without pydantic, and needs neither the publisher (one connection of its
    own reads the journal) nor rich's progress (shown only after a second of reading)."""
    found = _run(
        """
        import json, os, socket, sys
        with socket.socket() as sock:  # a free port, closed again: connection refused
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        os.environ["RMQDELAY_URL"] = f"amqp://guest:guest@127.0.0.1:{port}/%2F"
        from rmqdelay.cli import main
        sys.argv = ["rmqdelay", "scheduled", "list", "--json"]
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        heavy = ("pika", "pydantic", "pydantic_settings", "rmqdelay.settings",
                 "rmqdelay.amqp.publisher", "rich.progress", "aio_pika")
        print(json.dumps({"code": code, "loaded": [m for m in heavy if m in sys.modules]}))
        """
    )
    assert found == {"code": 1, "loaded": ["pika", "rmqdelay.settings"]}  # cannot connect


def test_the_cli_copies_of_constants_match_their_sources() -> None:
    """The CLI spells these out to build its options without importing their modules."""
    from rmqdelay.amqp.status import MAX_PARKED_PEEK
    from rmqdelay.cli.status import MAX_PARKED_PEEK as CLI_MAX_PARKED_PEEK
    from rmqdelay.cli.worker import LOG_LEVELS
    from rmqdelay.worker.logs import LEVELS

    assert CLI_MAX_PARKED_PEEK == MAX_PARKED_PEEK
    assert tuple(LEVELS) == LOG_LEVELS


@pytest.mark.parametrize(
    ("error", "code", "text"),
    [
        (usage_error("give exactly one of --delay or --at"), 2, "give exactly one"),
        (ValueError("bad value"), 1, "bad value"),
        (pika.exceptions.AMQPConnectionError("refused"), 1, "broker error: AMQPConnectionError"),
        (None, 1, "invalid settings: radix: Input should be a valid integer"),
    ],
)
def test_friendly_errors_still_sorts_errors_without_importing_them_first(
    error: Exception | None, code: int, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    @friendly_errors
    def command() -> None:
        if error is None:
            Settings(radix="x")  # a SettingsError, with every wrong setting named
        else:
            raise error

    with pytest.raises(Exit) as exit_info:
        command()
    assert exit_info.value.exit_code == code
    assert text in capsys.readouterr().err


def test_friendly_errors_lets_a_bug_through() -> None:
    @friendly_errors
    def command() -> None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        command()


def test_epilog_keeps_examples_one_per_line() -> None:
    text = epilog("A note.", "rmqdelay a", "rmqdelay b --x")
    assert text == "A note.\n\nExamples:\n\n\b\n  rmqdelay a\n  rmqdelay b --x"
    assert epilog("", "rmqdelay a") == "Example:\n\n\b\n  rmqdelay a"


def test_the_broker_modules_leave_aio_pika_to_the_asyncio_code() -> None:
    """The sync side (``rmqdelay publish``, ``cancel``...) imports these two modules."""
    loaded = _run(
        """
        import json, sys
        import rmqdelay.amqp.connections, rmqdelay.amqp.journal
        print(json.dumps([m for m in ("aio_pika", "aiormq", "yarl") if m in sys.modules]))
        """
    )
    assert loaded == []
