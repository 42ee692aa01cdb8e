"""``rmqdelay status`` shows messages stuck past their time in a tier, and ``--check``
fails on them: a real stuck hop, made with a policy (see tests/helpers/stuck_hop.py)."""

from __future__ import annotations

import json
import time
from typing import Any

from click.testing import Result

from rmqdelay import Settings
from rmqdelay.cli.status import STUCK_EXIT_CODE
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.cli import invoke, settings_env
from tests.helpers.stuck_hop import stuck_hop, stuck_hop_settings

DEST = "late"


def _status(settings: Settings, *args: str, env: dict[str, str] | None = None) -> Result:
    environment = {**settings_env(settings), **(env or {})}
    return invoke(environment, "status", *args, terminal_width=200)


def _json(result: Result) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def _tier(data: dict[str, Any], queue: str) -> dict[str, Any]:
    [row] = [t for t in data["tiers"] if t["queue"] == queue]
    found: dict[str, Any] = row
    return found


def test_a_topology_with_nothing_past_its_time_passes_the_check_at_once(
    amqp_url: str, prefix: str
) -> None:
    settings = stuck_hop_settings(amqp_url, prefix, DEST)
    started = time.monotonic()
    result = _status(settings, "--check", "--stuck-after", "1s")
    assert result.exit_code == 0, result.output
    assert "ok: no tier has held messages past their time for 1 s" in result.stderr
    assert "past their time: 0" in result.stdout
    assert time.monotonic() - started < 5  # one snapshot, no watching
    # without the API, the check cannot tell: an error, not a pass
    unreachable = _status(
        settings, "--check", env={"RMQDELAY_MANAGEMENT_URL": "http://127.0.0.1:1"}
    )
    assert unreachable.exit_code == 1, unreachable.output
    assert "--check cannot tell: the status came from AMQP" in unreachable.stderr
    amqp_only = _status(settings, "--check", "--amqp-only")
    assert amqp_only.exit_code == 2, amqp_only.output


def test_a_stuck_hop_is_counted_past_its_time_and_fails_the_check(
    amqp_url: str, prefix: str, admin: BrokerAdmin
) -> None:
    settings = stuck_hop_settings(amqp_url, prefix, DEST)
    with stuck_hop(settings, admin, DEST, 3) as tier:
        data = _json(_status(settings, "--json"))
        row = _tier(data, tier)
        # held past their time, not scheduled (3.10's API counts them in `messages`)
        assert (row["messages"], row["past_due"], row["past_due_for_s"]) == (0, 3, None)
        assert (data["scheduled"], data["past_due"]) == (0, 3)
        # AMQP counts none of them: unknown, never 0
        amqp = _json(_status(settings, "--json", "--amqp-only"))
        assert (_tier(amqp, tier)["past_due"], amqp["past_due"]) == (None, None)

        table = _status(settings)
        assert "past their time: 3" in table.stdout
        assert "cannot be told from one snapshot" in table.stdout

        started = time.monotonic()
        check = _status(settings, "--check", "--stuck-after", "1s")
        took = time.monotonic() - started
        assert check.exit_code == STUCK_EXIT_CODE == 3, check.output
        assert (
            f"stuck: tier {tier} holds 3 message(s) past their time, for at least 1 s"
            in check.stderr
        )
        assert 1.0 <= took < 10, "it watches the tier for --stuck-after, not longer"

        as_json = _status(settings, "--check", "--stuck-after", "1s", "--json")
        assert as_json.exit_code == STUCK_EXIT_CODE, as_json.output
        data = _json(as_json)
        [stuck] = data["stuck"]
        assert (stuck["queue"], stuck["ttl_ms"], stuck["past_due"]) == (tier, 1000, 3)
        assert stuck["for_s"] >= 1.0
        assert _tier(data, tier)["past_due_for_s"] == stuck["for_s"]
        assert data["stuck_after_s"] == 1.0

        metrics = _status(settings, "--check", "--stuck-after", "1s", "--prometheus")
        assert metrics.exit_code == STUCK_EXIT_CODE, metrics.output
        labels = f'prefix="{prefix}",tier="{tier}",ttl_ms="1000"'
        assert f"rmqdelay_past_due_messages{{{labels}}} 3" in metrics.stdout
        assert f"rmqdelay_past_due_seconds{{{labels}}} 1." in metrics.stdout
