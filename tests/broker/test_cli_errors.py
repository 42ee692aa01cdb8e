"""Bad input to the CLI, one case a row: its exit code and the words that name the fix.

Exit 2: the command line cannot run as typed (click's checks, a missing ``--yes``, flags
that exclude each other, an option's value of the wrong form or range). Exit 1: refused
after reading it (settings, a delay over ``max_delay``, the broker). Never a traceback;
our own errors are one line.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.helpers.cli import rmqdelay_env, run_cli

WORKER_APP = """\
from rmqdelay import Worker

app = Worker()


@app.handler("jobs")
async def handle(body: bytes) -> None:
    pass
"""


@pytest.fixture
def env(amqp_url: str, prefix: str) -> dict[str, str]:
    return rmqdelay_env(str(amqp_url), prefix, max_delay="1h")


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "cli_errors_app.py").write_text(WORKER_APP)
    return tmp_path


def other_vhost(amqp_url: str, vhost: str) -> str:
    return urlunsplit(urlsplit(str(amqp_url))._replace(path=f"/{vhost}"))


def wrong_password(amqp_url: str) -> str:
    parts = urlsplit(str(amqp_url))
    netloc = f"{parts.username}:not-the-password@{parts.hostname}:{parts.port or 5672}"
    return urlunsplit(parts._replace(netloc=netloc))


def check(result: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    said = result.stderr + result.stdout
    assert result.returncode == code, (result.returncode, said)
    assert "Traceback" not in said, said
    for word in words:
        assert word in said, (word, said)


def one_line(result: subprocess.CompletedProcess[str]) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        # settings, from flags: exit 1, naming the setting and the accepted form
        (("topology", "plan", "--url", "not a url"), 1, ("url:", "amqp://user:password@host")),
        (("topology", "plan", "--url", "http://foo"), 1, ("'http://foo' is not an AMQP URL",)),
        (("topology", "plan", "--prefix", "a.b"), 1, ("prefix 'a.b'", "no dots")),
        (("topology", "plan", "--prefix", "amq"), 1, ("must not start with 'amq.'",)),
        # values the settings refuse: exit 1
        (("publish", "jobs", "x", "--delay", "1e400"), 1, ("over the maximum of 1h",)),
        (("publish", "jobs", "x", "--delay", "1e100000000"), 1, ("over the maximum of 1h",)),
        # the command line itself: exit 2, the same for every command
        (("publish", "jobs", "x", "--delay", "-5s"), 2, ("--delay must not be negative",)),
        (("publish", "jobs", "x", "--delay", "500y"), 2, ("cannot read --delay '500y'",)),
        (("publish", "jobs", "x", "--delay", "1s", "-H", "nokey"), 2, ("key=value",)),
        (("parked", "replay", "--delay", "soon"), 2, ("cannot read --delay 'soon'",)),
        (("publish", "jobs", "x"), 2, ("exactly one of --delay or --at",)),
        (("publish", "jobs", "x", "--delay", "1s", "--at", "2030-01-01T00:00:00Z"), 2, ()),
        (("parked", "purge"), 2, ("--yes",)),
        (("topology", "destroy"), 2, ("--yes",)),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, tuple) else None,
)
def test_our_errors_are_one_line_with_the_right_exit_code(
    env: dict[str, str], args: tuple[str, ...], code: int, words: tuple[str, ...]
) -> None:
    started = time.monotonic()
    result = run_cli(env, *args)
    check(result, code, *words)
    one_line(result)
    assert time.monotonic() - started < 20  # "1e100000000" must not compute 10**100000000


@pytest.mark.parametrize(
    "args",
    [
        ("parked", "list", "--limit", "0"),
        ("publish",),
        ("no-such-command",),
        ("worker", "cli_errors_app:app", "--concurrency", "0"),
        ("worker", "cli_errors_app:app", "--prefetch", "70000"),
        ("worker", "cli_errors_app:app", "--metrics-port", "99999"),  # was an OverflowError
    ],
    ids=" ".join,
)
def test_click_usage_errors_exit_2(env: dict[str, str], app_dir: Path, args: tuple[str]) -> None:
    check(run_cli(env, *args, cwd=app_dir), 2, "Usage:")


def test_a_bad_log_format_is_a_usage_error(env: dict[str, str], app_dir: Path) -> None:
    result = run_cli(env, "worker", "cli_errors_app:app", "--log-format", "xml", cwd=app_dir)
    check(result, 2, "--log-format 'xml': use text or json")
    one_line(result)


def test_a_malformed_config_file_is_named(env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "broken.toml"
    config.write_text('prefix = "x\nradix = \n')
    result = run_cli(env, "topology", "plan", "--config", str(config))
    check(result, 1, f"config file '{config}' is not valid TOML")
    one_line(result)


@pytest.mark.parametrize(
    "args", [("topology", "plan"), ("parked", "list"), ("publish", "jobs", "x", "--delay", "1s")]
)
def test_an_unknown_vhost_is_named_by_every_client(
    env: dict[str, str], amqp_url: str, prefix: str, args: tuple[str, ...]
) -> None:
    vhost = f"{prefix}-nowhere"
    result = run_cli({**env, "RMQDELAY_URL": other_vhost(amqp_url, vhost)}, *args)
    check(result, 1, f"virtual host '{vhost}' does not exist")
    one_line(result)


@pytest.mark.parametrize("args", [("topology", "verify"), ("parked", "list"), ("status",)])
def test_wrong_credentials_are_named_by_every_client(
    env: dict[str, str], amqp_url: str, args: tuple[str, ...]
) -> None:
    result = run_cli({**env, "RMQDELAY_URL": wrong_password(amqp_url)}, *args)
    check(result, 1, "refused the login of user", "wrong user name or password")
    one_line(result)


def test_the_worker_stops_on_wrong_credentials(
    env: dict[str, str], amqp_url: str, app_dir: Path
) -> None:
    started = time.monotonic()
    result = run_cli(
        {**env, "RMQDELAY_URL": wrong_password(amqp_url)},
        "worker",
        "cli_errors_app:app",
        cwd=app_dir,
        timeout=30,
    )
    check(result, 1, "error: the broker at", "wrong user name or password")
    assert time.monotonic() - started < 15


def test_the_worker_names_the_missing_queue_and_the_command(
    env: dict[str, str], app_dir: Path
) -> None:
    result = run_cli(env, "worker", "cli_errors_app:app", cwd=app_dir)
    check(result, 1, "work queue", "rmqdelay topology apply --destination jobs")


def test_consume_says_what_it_waits_for(env: dict[str, str], prefix: str) -> None:
    assert run_cli(env, "topology", "apply", "-d", "jobs").returncode == 0
    result = run_cli(env, "consume", "jobs", "--timeout", "0.3")
    check(result, 0, f"waiting for messages on queue {prefix}.work.jobs (up to 0.3s)")
    counted = run_cli(env, "consume", "jobs", "--count", "2", "--timeout", "0.3")
    check(counted, 1, "waiting for 2 message(s)", "received 0 of 2")
    assert "waiting" not in counted.stdout  # stdout keeps only messages


def test_the_users_text_is_printed_as_typed_not_as_markup_or_emoji(env: dict[str, str]) -> None:
    """rich would read '[/]' as markup (a MarkupError traceback after the publish) and
    ':b:' as an emoji."""
    assert run_cli(env, "topology", "apply", "-d", "jobs").returncode == 0
    odd = "[/]x:b:[bold]"
    published = run_cli(env, "publish", "jobs", "x", "--delay", "10m", "--message-id", odd)
    check(published, 0)
    assert published.stdout.startswith(f"{odd} due "), published.stdout
    listed = run_cli(env, "scheduled", "list")
    check(listed, 0, odd)
    cancelled = run_cli(env, "cancel", odd, "[/]unknown")
    check(cancelled, 1, f"{odd}: cancelled", "[/]unknown: unknown")
    bad_app = run_cli(env, "worker", "a:b:c")
    check(bad_app, 1, "(from 'a:b:c')")
    one_line(bad_app)
