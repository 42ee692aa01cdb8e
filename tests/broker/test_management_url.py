"""Where the management API is (management_url), as ``rmqdelay topology`` finds and uses it.

A management URL that does not answer must be reported as such, naming the URL and the
setting, and never turn into bindings reported missing.
"""

from __future__ import annotations

import subprocess
import urllib.parse
import uuid
from collections.abc import Iterator

import pytest
from broker import BrokerInfo

from rmqdelay import Settings, TopologyManager
from tests.helpers.brokerctl import BrokerAdmin, make_prefix
from tests.helpers.cli import rmqdelay_env, run_cli
from tests.helpers.support import closed_port


def topology(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(env, "topology", *args, timeout=120)


@pytest.fixture
def management_url(broker: BrokerInfo) -> str:
    if not broker.management_url:
        pytest.skip("the broker's management API is not available")
    return broker.management_url


@pytest.fixture(scope="module")
def env(amqp_url: str, admin: BrokerAdmin) -> Iterator[dict[str, str]]:
    """The CLI's environment, with the topology applied for ``jobs``: one for the module,
    whose tests only read it."""
    prefix = make_prefix("management-url")
    env = rmqdelay_env(amqp_url, prefix, max_delay="1m", management_url=None)
    env["COLUMNS"] = "250"
    try:
        assert topology(env, "apply", "-d", "jobs").returncode == 0
        yield env
    finally:
        admin.cleanup_prefix(prefix)


def test_unreachable_management_url_is_said_not_missing(env: dict[str, str]) -> None:
    wrong = f"http://127.0.0.1:{closed_port()}"
    verify = topology(env, "verify", "-d", "jobs", "--management-url", wrong)
    assert verify.returncode == 1
    assert "missing" not in verify.stdout + verify.stderr
    line = " ".join(verify.stderr.split())  # rich may wrap
    assert f"the management API at {wrong} is unreachable" in line
    assert "RMQDELAY_MANAGEMENT_URL" in line and "--management-url" in line

    plan = topology({**env, "RMQDELAY_MANAGEMENT_URL": wrong}, "plan", "-d", "jobs")
    assert plan.returncode == 1 and "unreachable" in plan.stderr
    assert "missing" not in plan.stdout and "unchecked" in plan.stdout


def test_the_right_management_url_checks_bindings(
    env: dict[str, str], management_url: str, amqp_url: str
) -> None:
    verify = topology(env, "verify", "-d", "jobs", "--management-url", management_url)
    assert verify.returncode == 0, verify.stderr
    assert "is complete" in verify.stdout and verify.stderr == ""

    plan = topology(env, "plan", "-d", "jobs", "--show-ok", "--management-url", management_url)
    assert plan.returncode == 0, plan.stderr
    assert "unchecked" not in plan.stdout and "binding" in plan.stdout

    prefix = env["RMQDELAY_PREFIX"]
    settings = Settings(url=amqp_url, prefix=prefix, max_delay="1m", management_url=management_url)
    with TopologyManager(settings) as manager:
        assert manager.management_problem is None
        assert manager.discover_destinations() == ["jobs"]


def test_management_url_credentials_win_and_stay_hidden(
    env: dict[str, str], management_url: str, admin: BrokerAdmin, prefix: str
) -> None:
    # a user with no management tag: the API refuses it, though the AMQP URL's user works
    user, password = f"{prefix}-nomgmt", uuid.uuid4().hex
    admin.add_user(user, password, ".*", ".*", ".*", vhost=admin.vhost)
    parts = urllib.parse.urlsplit(management_url)
    with_creds = parts._replace(netloc=f"{user}:{password}@{parts.netloc}").geturl()
    verify = topology({**env, "RMQDELAY_MANAGEMENT_URL": with_creds}, "verify", "-d", "jobs")
    assert verify.returncode == 1
    assert "refused the credentials (HTTP 401)" in verify.stderr
    assert password not in verify.stdout + verify.stderr
    assert f"at {management_url.rstrip('/')} refused" in " ".join(verify.stderr.split())


def test_several_management_urls_are_tried_in_order(
    env: dict[str, str], management_url: str, amqp_url: str
) -> None:
    wrong = f"http://127.0.0.1:{closed_port()}"
    several = {**env, "RMQDELAY_URL": f"{amqp_url},{amqp_url}"}  # a list: one vhost taken
    verify = topology(
        several, "verify", "-d", "jobs", "--management-url", f"{wrong},{management_url}"
    )
    assert verify.returncode == 0, verify.stderr
    assert "is complete" in verify.stdout and verify.stderr == ""

    settings = Settings(
        url=[amqp_url, amqp_url],
        management_url=[wrong, management_url],
        prefix=env["RMQDELAY_PREFIX"],
        max_delay="1m",
    )
    with TopologyManager(settings) as m:
        assert m.management_problem is None
        assert m.management.base == management_url.rstrip("/")
        assert m.discover_destinations() == ["jobs"]

    # none answers: each is named, and the setting
    nowhere = topology(
        env, "verify", "--management-url", f"{wrong},http://127.0.0.1:{closed_port()}"
    )
    assert nowhere.returncode == 1
    assert " ".join(nowhere.stderr.split()).count("is unreachable") == 2
