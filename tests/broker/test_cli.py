"""The CLI end to end, as a user runs it: separate processes, settings from the env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import rmqdelay_env, run_cli


@pytest.fixture
def env(amqp_url: str, prefix: str) -> dict[str, str]:
    return rmqdelay_env(amqp_url, prefix, max_delay="1h")


def test_apply_publish_consume_json_destroy(env: dict[str, str], prefix: str) -> None:
    plan = run_cli(env, "topology", "plan", "-d", "jobs")
    assert plan.returncode == 1, plan.stdout  # everything is missing before apply
    assert "missing" in plan.stdout

    applied = run_cli(env, "topology", "apply", "-d", "jobs")
    assert applied.returncode == 0, applied.stderr
    assert f"{prefix}.work.jobs" in applied.stdout
    assert run_cli(env, "topology", "plan", "-d", "jobs").returncode == 0
    assert run_cli(env, "topology", "verify", "-d", "jobs").returncode == 0

    published = run_cli(env, "publish", "jobs", '{"n": 1}', "--json", "--delay", "3s", "-H", "k=v")
    assert published.returncode == 0, published.stderr
    result = json.loads(published.stdout)  # --json: the result, one object
    message_id = result["message_id"]
    assert (result["destination"], result["outcome"]) == ("jobs", "scheduled")
    assert isinstance(result["due_at_ms"], int)
    assert "the body is JSON: sent as application/json" in published.stderr
    stdin = run_cli(env, "publish", "jobs", "-", "--delay", "0.1s", input="from stdin")
    assert stdin.returncode == 0, stdin.stderr
    assert stdin.stdout.split()[1] == "due" and stdin.stderr == ""

    consumed = run_cli(env, "consume", "jobs", "--count", "2", "--timeout", "20", "--json")
    assert consumed.returncode == 0, consumed.stderr
    lines = [json.loads(line) for line in consumed.stdout.splitlines()]
    # by due time as a rule, but a loaded machine may start the second CLI after the
    # first message's 3 s: the order is not what this test is about
    assert sorted(line["body"] for line in lines) == sorted(["from stdin", '{"n":1}'])
    (first,) = (line for line in lines if line["body"] == '{"n":1}')
    assert first["message_id"] == message_id
    assert first["headers"]["k"] == "v"
    for key in ("due_at_ms", "received_at_ms", "lateness_ms"):
        assert isinstance(first[key], int)
    assert first["lateness_ms"] >= 0

    timed_out = run_cli(env, "consume", "jobs", "--count", "1", "--timeout", "0.5")
    assert timed_out.returncode == 1
    assert "received 0 of 1" in timed_out.stderr

    refused = run_cli(env, "topology", "destroy")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    destroyed = run_cli(env, "topology", "destroy", "--yes", "-d", "jobs")
    assert destroyed.returncode == 0, destroyed.stderr
    assert run_cli(env, "topology", "verify", "-d", "jobs").returncode == 1


def test_destroy_refuses_while_tiers_hold_messages(env: dict[str, str]) -> None:
    assert run_cli(env, "topology", "apply", "-d", "jobs").returncode == 0
    assert run_cli(env, "publish", "jobs", "x", "--delay", "10m").returncode == 0
    refused = run_cli(env, "topology", "destroy", "--yes", "-d", "jobs")
    assert refused.returncode == 1
    assert "hold messages" in refused.stderr and "--force" in refused.stderr
    assert run_cli(env, "topology", "destroy", "--yes", "--force", "-d", "jobs").returncode == 0


def test_user_errors_are_one_clear_line(env: dict[str, str], tmp_path: Path) -> None:
    assert run_cli(env, "topology", "apply", "-d", "jobs").returncode == 0
    usage = {  # an option's value of the wrong form or range: exit 2, as the CLI reference says
        ("publish", "jobs", "x", "--delay", "-1s"): "--delay must not be negative",
        ("publish", "jobs", "x", "--delay", "soon"): "cannot read --delay",
        ("publish", "jobs", "x", "--at", "2030-01-01T00:00:00"): "no timezone",
    }
    cases = {
        ("publish", "jobs", "x", "--delay", "2h"): "over the maximum of 1h",
        ("publish", "nope", "x", "--delay", "1s"): "topology apply --destination nope",
        ("publish", "bad name", "x", "--delay", "1s"): "must be words",
        ("publish", "jobs", "{", "--content-type", "json", "--delay", "1s"): "not JSON",
        ("topology", "plan", "--config", str(tmp_path / "none.toml")): "does not exist",
    }
    for args, expected in [*usage.items(), *cases.items()]:
        result = run_cli(env, *args)
        assert result.returncode == (2 if args in usage else 1), args
        assert expected in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_flags_over_env_over_config_file(env: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "rmqdelay.toml"
    config.write_text('radix = 17\nprefix = "from-file"\n')
    bad = run_cli(env, "topology", "plan", "--config", str(config))
    assert bad.returncode == 1 and "radix must be from 2 to 16" in bad.stderr
    config.write_text('radix = 8\nprefix = "from-file"\nmax_delay = "1m"\n')
    wrong_url = {**env, "RMQDELAY_URL": "amqp://guest:hunter2@127.0.0.1:1/%2F"}
    del wrong_url["RMQDELAY_PREFIX"]  # so the file's prefix applies
    result = run_cli(wrong_url, "topology", "plan", "--config", str(config))
    assert "127.0.0.1:1" in result.stderr  # the env URL beat the file's default...
    assert "hunter2" not in result.stderr + result.stdout  # ...and its password is masked
    flagged = run_cli(
        wrong_url, "topology", "plan", "--config", str(config), "--url", env["RMQDELAY_URL"]
    )
    assert flagged.returncode == 1  # the flag URL works: everything under from-file is missing
    assert "topology from-file" in flagged.stdout.replace("\n", " ")


def test_output_into_a_pipe_is_plain_and_never_wrapped(env: dict[str, str]) -> None:
    """Into a pipe (run_cli captures stdout) at the default width, no COLUMNS: every line
    whole, no box drawing; the tables are plain columns, the times not cut."""
    narrow = {k: v for k, v in env.items() if k != "COLUMNS"}
    applied = run_cli(narrow, "topology", "apply", "-d", "jobs", "-d", "pipe-output-" + "x" * 40)
    assert applied.returncode == 0, applied.stderr
    (line,) = [x for x in applied.stdout.splitlines() if x.startswith("applied")]
    assert len(line) > 80 and line.endswith("work queues: " + ", ".join(
        f"{env['RMQDELAY_PREFIX']}.work.{d}" for d in ("jobs", "pipe-output-" + "x" * 40)
    ))  # fmt: skip
    plan = run_cli(narrow, "topology", "plan", "-d", "jobs", "--show-ok")
    assert plan.returncode == 0, plan.stderr
    assert not set("┏┃│─━") & set(plan.stdout), plan.stdout
    assert plan.stdout.splitlines()[1].split() == ["kind", "name", "status", "detail"]
    odd = "an-id-long-enough-that-a-line-of-80-columns-would-have-to-wrap-it-" + "y" * 30
    published = run_cli(narrow, "publish", "jobs", "x", "--delay", "10m", "--message-id", odd)
    assert published.returncode == 0, published.stderr
    cancelled = run_cli(narrow, "cancel", odd)
    assert cancelled.returncode == 0, cancelled.stderr
    (said,) = cancelled.stdout.splitlines()
    assert said.startswith(f"{odd}: cancelled (was due ") and said.endswith("+00:00)")
    again = run_cli(narrow, "cancel", odd)  # a second cancel answers as the first did
    assert again.returncode == 0 and again.stdout == cancelled.stdout
    listed = run_cli(narrow, "scheduled", "list")
    assert listed.returncode == 0 and odd not in listed.stdout
    dest = "pipe-output-" + "x" * 40
    added = run_cli(narrow, "recurring", "add", "pipe-report", dest, "tick", "--every", "1h")
    assert added.returncode == 0, added.stderr
    try:
        rows = run_cli(narrow, "recurring", "list")
        assert rows.returncode == 0, rows.stderr
        (row,) = [r for r in rows.stdout.splitlines() if r.startswith("pipe-report ")]
        assert row.split()[1:5] == ["every", "1h", dest, "active"]
        assert len(row.split()[5]) == len("2026-01-01T00:00:00.000+00:00")  # not cut
        assert not set("┏┃│─━…") & set(rows.stdout), rows.stdout
    finally:
        removed = run_cli(narrow, "recurring", "remove", "pipe-report")
        assert removed.returncode == 0, removed.stderr
    assert (
        run_cli(
            narrow, "topology", "destroy", "--yes", "--force", "-d", "jobs", "-d", dest
        ).returncode
        == 0
    )


def test_reschedule_earlier_works_with_the_default_settings(env: dict[str, str]) -> None:
    """A fresh prefix, no setting but the URL, the prefix and a maximum delay: the body
    is in the journal (journal_bodies defaults to true), so an earlier time is a fresh
    copy, handled once at its new time."""
    assert "RMQDELAY_JOURNAL_BODIES" not in env
    assert run_cli(env, "topology", "apply", "-d", "jobs").returncode == 0
    try:
        sent = run_cli(env, "publish", "jobs", "early bird", "--delay", "50m", "--json")
        assert sent.returncode == 0, sent.stderr
        message_id = json.loads(sent.stdout)["message_id"]
        moved = run_cli(env, "reschedule", message_id, "--delay", "1s")
        assert moved.returncode == 0, (moved.stdout, moved.stderr)
        assert moved.stdout.startswith(f"{message_id}: rescheduled from ")
        assert moved.stdout.rstrip().endswith("(a fresh copy was published)")
        got = run_cli(env, "consume", "jobs", "--count", "1", "--timeout", "30", "--json")
        assert got.returncode == 0, got.stderr
        (line,) = got.stdout.splitlines()
        message = json.loads(line)
        assert (message["message_id"], message["body"]) == (message_id, "early bird")
        listed = run_cli(env, "scheduled", "list", "--json")
        assert listed.returncode == 0 and message_id not in listed.stdout  # moved, not twice
    finally:
        destroyed = run_cli(env, "topology", "destroy", "--yes", "--force", "-d", "jobs")
        assert destroyed.returncode == 0, destroyed.stderr
