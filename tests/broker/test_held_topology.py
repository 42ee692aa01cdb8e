"""``topology plan/apply/verify --held`` mark a destination held, and report a marker left
for one no longer held; ``status`` says which destinations are held."""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import rmqdelay_env, run_cli


@pytest.fixture
def env(amqp_url: str, prefix: str) -> dict[str, str]:
    return rmqdelay_env(amqp_url, prefix, max_delay="1h")


def test_held_marked_reported_stale_and_shown_by_status(env: dict[str, str], prefix: str) -> None:
    marker = f"{prefix}.held.jobs"
    applied = run_cli(env, "topology", "apply", "-d", "jobs", "--held", "emails")
    assert applied.returncode == 0, applied.stderr
    assert "held (consumers wait out the last 5120 ms): emails" in applied.stdout
    assert run_cli(env, "topology", "plan", "-d", "jobs", "--held", "emails").returncode == 0
    # the settings' held_destinations and --held are merged
    both = {**env, "RMQDELAY_HELD_DESTINATIONS": '["jobs"]'}
    assert run_cli(both, "topology", "apply", "--held", "emails").returncode == 0
    assert run_cli(both, "topology", "verify", "--held", "emails").returncode == 0

    # jobs is no longer held here: every verb reports its marker, with how to remove it
    plan = run_cli(env, "topology", "plan", "-d", "jobs", "--held", "emails")
    assert plan.returncode == 1, plan.stdout
    assert marker in plan.stdout and "stale" in plan.stdout
    assert "rabbitmqadmin delete exchange" in plan.stdout
    verify = run_cli(env, "topology", "verify", "-d", "jobs", "--held", "emails")
    assert verify.returncode == 1, verify.stdout
    assert f"exchange {marker!r} marks 'jobs' held" in verify.stdout
    again = run_cli(env, "topology", "apply", "-d", "jobs", "--held", "emails")
    assert again.returncode == 0, again.stderr
    assert "warning:" in again.stderr and marker in again.stderr
    assert "restart its publishers" in again.stderr
    # without the management API, a destination named is still checked passively
    no_api = {**env, "RMQDELAY_MANAGEMENT_URL": "http://127.0.0.1:9"}
    passive = run_cli(no_api, "topology", "verify", "-d", "jobs", "--held", "emails")
    assert f"exchange {marker!r} marks 'jobs' held" in passive.stdout

    status = run_cli(env, "status", "-d", "jobs", "-d", "emails", "--json")
    assert status.returncode == 0, status.stderr
    rows = {row["destination"]: row["held"] for row in json.loads(status.stdout)["destinations"]}
    assert rows == {"jobs": True, "emails": True}
    shown = run_cli(env, "status", "-d", "jobs", "-d", "emails", "--amqp-only")
    assert shown.returncode == 0, shown.stderr
    assert "held (consumers wait out up to 5s120ms" in shown.stdout
    assert "jobs, emails" in shown.stdout

    destroyed = run_cli(env, "topology", "destroy", "--yes", "-d", "jobs", "-d", "emails")
    assert destroyed.returncode == 0, destroyed.stderr
    assert run_cli(env, "topology", "verify", "--held", "emails").returncode == 1
    after = run_cli(env, "status", "-d", "jobs", "--json", "--amqp-only")
    assert json.loads(after.stdout)["destinations"][0]["held"] is False


def test_destroy_removes_the_marker_of_each_destination_it_destroys(
    env: dict[str, str], amqp_url: str, prefix: str
) -> None:
    """An x-delay bridge's own marker (its argument keeps ``plan`` from calling it stale)
    goes with its destination's queue, as a left-over one does."""
    import pika

    from rmqdelay.core.topology import BRIDGE_MARKER_ARGUMENT

    assert run_cli(env, "topology", "apply", "-d", "bridged").returncode == 0
    marker = f"{prefix}.held.bridged"
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        arguments = {BRIDGE_MARKER_ARGUMENT: f"{prefix}.x"}
        channel.exchange_declare(marker, "fanout", durable=True, arguments=arguments)
        assert run_cli(env, "topology", "plan", "-d", "bridged").returncode == 0
        destroyed = run_cli(env, "topology", "destroy", "--yes", "-d", "bridged")
        assert destroyed.returncode == 0, destroyed.stderr
        with pytest.raises(pika.exceptions.ChannelClosedByBroker, match="NOT_FOUND"):
            connection.channel().exchange_declare(marker, passive=True)
    finally:
        connection.close()
