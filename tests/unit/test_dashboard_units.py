"""The dashboard without a broker: where it may listen, its login and CSRF guards on
every POST route, its page cursor, and that the publisher path never imports its
libraries. (tests/broker/test_dashboard.py drives it against the broker.)"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from rmqdelay import Settings
from rmqdelay.dashboard.app import Dashboard, create_app
from rmqdelay.dashboard.binding import check_bind, is_loopback
from rmqdelay.dashboard.refusals import explain, scrub
from rmqdelay.errors import AccessRefusedError, ConfigurationError
from rmqdelay.settings import SettingsError
from tests.helpers.cli import invoke, rmqdelay_env
from tests.helpers.support import closed_port

TOKEN = "unit-Token-5e1c0a99"
PASSWORD = "unit-Password-77aa01"


def _settings(**dashboard: Any) -> Settings:
    """Settings whose broker is nowhere: nothing here may get as far as connecting."""
    return Settings(url=f"amqp://u:{PASSWORD}@127.0.0.1:{closed_port()}/%2F", **dashboard)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.9.9.9", "::1", "[::1]", "localhost"])
def test_loopback_needs_no_login(host: str) -> None:
    assert is_loopback(host)
    assert not check_bind(_settings(dashboard_host=host)).protected


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "dashboard.example"])
def test_anything_else_is_refused_without_a_login(host: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        check_bind(_settings(dashboard_host=host))
    assert "without authentication" in str(refused.value)
    assert "dashboard_token" in str(refused.value)
    assert check_bind(_settings(dashboard_host=host, dashboard_token=TOKEN)).protected
    login = {"dashboard_user": "ops", "dashboard_password": PASSWORD}
    assert check_bind(_settings(dashboard_host=host, **login)).protected


def test_an_empty_token_is_no_login() -> None:
    with pytest.raises(ConfigurationError):
        check_bind(_settings(dashboard_host="0.0.0.0", dashboard_token=""))


def test_a_user_needs_a_password() -> None:
    with pytest.raises(SettingsError, match="dashboard_user and dashboard_password"):
        _settings(dashboard_user="ops")


def test_the_command_refuses_0_0_0_0_without_a_login_and_names_the_setting() -> None:
    env = rmqdelay_env(f"amqp://u:{PASSWORD}@127.0.0.1:{closed_port()}/%2F")
    result = invoke(env, "dashboard", "--host", "0.0.0.0")
    assert result.exit_code == 1
    assert "refusing to serve the dashboard on '0.0.0.0' without authentication" in result.output
    assert "RMQDELAY_DASHBOARD_TOKEN" in result.output
    assert PASSWORD not in result.output


def test_the_settings_show_no_dashboard_secret() -> None:
    settings = _settings(dashboard_token=TOKEN, dashboard_user="ops", dashboard_password=PASSWORD)
    for shown in (repr(settings), str(settings), settings.to_json()):
        assert TOKEN not in shown and PASSWORD not in shown


def test_errors_are_scrubbed_and_a_refusal_says_which_permission() -> None:
    settings = _settings(dashboard_token=TOKEN)
    text = explain(OSError(f"cannot reach amqp://u:{PASSWORD}@h/ with {TOKEN}"), settings)
    assert PASSWORD not in text and TOKEN not in text
    refused = explain(AccessRefusedError("q", "ACCESS_REFUSED - write to 'x'"), settings)
    assert "lacks the permission" in refused and "write to 'x'" in refused
    # a page is scrubbed of long secrets only: a short one could be part of an id
    assert scrub(f"id guest-1 {PASSWORD}", settings, every=False) == "id guest-1 ***"


def _post_paths(app: Any) -> list[str]:
    paths = []
    for route in app.routes:
        if isinstance(route, Route) and "POST" in (route.methods or ()):
            paths.append(re.sub(r"\{[^}]+\}", "x", route.path))
    return paths


def test_every_post_route_checks_origin_and_csrf() -> None:
    app = create_app(_settings())
    paths = _post_paths(app)
    assert "/scheduled/x/cancel" in paths and "/api/parked/purge" in paths
    client = TestClient(app)
    page = client.get("/login")
    token = client.cookies["rmqdelay_csrf"]
    assert page.status_code == 200 and token in page.text
    for path in paths:
        evil = client.post(path, data={"csrf_token": token}, headers={"Origin": "https://x.test"})
        assert evil.status_code == 403, path
        assert "cross-site" in evil.text, path
        missing = client.post(path, data={})
        assert missing.status_code == 403, path
        assert "CSRF token" in missing.text, path


def test_the_login_guards_every_page_but_the_static_files() -> None:
    login = {"dashboard_user": "ops", "dashboard_password": PASSWORD}
    client = TestClient(create_app(_settings(dashboard_token=TOKEN, **login)))
    assert client.get("/api/overview").status_code == 401
    assert client.get("/api/scheduled", headers={"Authorization": "Bearer nope"}).status_code == 401
    wrong = base64.b64encode(b"ops:nope").decode()
    assert client.get("/api/parked", headers={"Authorization": f"Basic {wrong}"}).status_code == 401
    answer = client.get("/static/app.js")
    assert answer.status_code == 200
    assert "default-src 'self'" in answer.headers["content-security-policy"]
    assert answer.headers["x-frame-options"] == "DENY"


def test_a_bearer_script_needs_no_csrf_token_but_a_browser_origin_still_counts() -> None:
    client = TestClient(
        create_app(_settings(dashboard_token=TOKEN, dashboard_read_only=True)),
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    refused = client.post("/api/parked/replay")
    assert refused.status_code == 403 and "read-only" in refused.json()["text"]
    evil = client.post("/api/parked/replay", headers={"Origin": "https://x.test"})
    assert evil.status_code == 403 and "cross-site" in evil.json()["text"]


def test_a_bad_filter_is_said_on_the_page() -> None:
    dashboard = Dashboard(_settings())
    client = TestClient(dashboard.app())
    answer = client.get("/api/scheduled?due_to=tomorrow-ish")
    assert answer.status_code == 400 and "neither a duration" in answer.json()["error"]
    assert client.get("/api/scheduled?limit=0").json()["error"].startswith("limit must be")


def test_the_publisher_and_the_cli_leave_the_dashboard_libraries_out() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        import rmqdelay
        from rmqdelay import Publisher, AsyncPublisher
        from rmqdelay.cli.app import app
        import rmqdelay.cli.publish, rmqdelay.cli.dashboard
        heavy = ("starlette", "uvicorn", "jinja2", "rmqdelay.dashboard")
        print(json.dumps([m for m in heavy if m in sys.modules]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
