"""The dashboard against the real broker: every page and its JSON twin answer, no secret
leaves in any of them, a cross-site POST is refused, a read-only broker user sees the
pages and is told why an action was refused, and the read-only mode refuses actions."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from starlette.testclient import TestClient

from rmqdelay import Publisher, Settings
from rmqdelay.dashboard import schedule as schedule_source
from rmqdelay.dashboard.app import create_app
from rmqdelay.dashboard.follow import StoreFollower
from tests.helpers.brokerctl import BrokerAdmin, with_login
from tests.helpers.cli import CLI, rmqdelay_env
from tests.helpers.parking import park
from tests.helpers.worker_helpers import TestTopology

PASSWORD = "dash-Broker-Pw-7c1e95"
TOKEN = "dash-Token-4b0a77e2c3"
METRICS_PASSWORD = "dash-Metrics-Pw-0d9f"
SECRETS = (PASSWORD, TOKEN, METRICS_PASSWORD)


def _settings(base: Settings, url: str, **dashboard: Any) -> Settings:
    """The topology's settings (already applied) with another URL and dashboard settings;
    the dashboard's own settings change no queue. Its store in memory unless a test says
    where (a file of the prefix's under the user's cache otherwise)."""
    return Settings(
        url=url,
        prefix=base.prefix,
        max_delay="1h",
        connection_name=base.connection_name,
        journal_bodies=True,
        **{"dashboard_state": ":memory:", **dashboard},
    )


Dashboards = Callable[..., TestClient]


@pytest.fixture
def dashboard() -> Iterator[Dashboards]:
    """``dashboard(settings, **client_options)``: a TestClient of a dashboard on its own
    event loop until the test ends (the schedule's follower and the jobs run on it)."""
    with ExitStack() as stack:

        def make(settings: Settings, **options: Any) -> TestClient:
            client: TestClient = stack.enter_context(TestClient(create_app(settings), **options))
            return client

        yield make


@pytest.fixture
def user(admin: BrokerAdmin, prefix: str) -> Iterator[str]:
    """A broker user of this test's own with every permission, and a long password."""
    name = f"{prefix}-dash"
    admin.add_user(name, PASSWORD, ".*", ".*", ".*")
    admin._send("PUT", f"users/{admin._q(name)}", {"password": PASSWORD, "tags": "monitoring"})
    yield name
    admin.delete_user(name)


def _every_answer(client: TestClient, message_id: str) -> dict[str, Any]:
    """Every page and API answer of the dashboard, by path."""
    paths = ["/", "/overview/panel", "/scheduled", "/parked", "/recurring", "/login"]
    paths += [f"/scheduled/{message_id}", "/scheduled?order=newest&limit=20"]
    paths += [f"/api{p}" for p in ("/overview", "/scheduled", "/parked", "/recurring")]
    paths += [f"/api/scheduled/{message_id}", "/scheduled/no-such-id", "/api/nope"]
    return {path: client.get(path) for path in paths}


def test_every_page_answers_without_a_secret(
    shared_topology: TestTopology, amqp_url: str, user: str, dashboard: Dashboards
) -> None:
    dest = shared_topology.dest("dash")
    base = shared_topology.settings([dest])
    settings = _settings(
        base,
        with_login(amqp_url, user, PASSWORD),
        dashboard_token=TOKEN,
        dashboard_worker_metrics=[f"http://metrics:{METRICS_PASSWORD}@127.0.0.1:9/metrics"],
    )
    message_id = f"dash-{uuid.uuid4().hex[:8]}"
    with Publisher(settings) as publisher:
        publisher.publish(dest, {"order": 42}, delay="30m", message_id=message_id)
        publisher.add_recurring(f"{dest}-nightly", dest, b"tick", cron="*/30 * * * *", tz="UTC")
    park(settings, dest, f"parked-{message_id}")

    client = dashboard(settings, headers={"Authorization": f"Bearer {TOKEN}"})
    answers = _every_answer(client, message_id)
    for path, answer in answers.items():
        seen = answer.text + "".join(f"{k}: {v}\n" for k, v in answer.headers.items())
        for secret in SECRETS:
            assert secret not in seen, f"{path} shows a secret"
        assert answer.status_code in (200, 404), (path, answer.status_code, answer.text[:500])
    assert answers["/api/nope"].status_code == 404
    assert answers["/scheduled/no-such-id"].status_code == 404

    overview = answers["/api/overview"].json()
    # the message, and the recurring schedule's first occurrence (within 30 minutes)
    assert overview["schedule"]["by_destination"] == {dest: 2}
    buckets = overview["schedule"]["buckets"]  # the occurrence: within a minute at :29 or :59
    assert buckets["minute"] + buckets["hour"] == 2 and sum(buckets.values()) == 2
    assert overview["parked_by_destination"] == {dest: 1}
    assert [w["up"] for w in overview["workers"]] == [False]
    assert overview["broker"]["journal_leader"]
    assert "due-chart" in answers["/"].text

    rows = answers["/api/scheduled"].json()["rows"]
    assert message_id in [r["message_id"] for r in rows if r["destination"] == dest]
    keyed = [r["key"] for r in rows if r["destination"] == dest and r["key"]]
    assert [k.split("@")[0] for k in keyed] == [f"recurring:{dest}-nightly"]
    assert message_id in answers["/scheduled"].text
    detail = answers[f"/api/scheduled/{message_id}"].json()
    assert [c["state"] for c in detail["copies"]] == ["pending"]
    assert detail["copies"][0]["body"] == '{"order":42}'
    assert [h["kind"] for h in detail["history"]] == ["scheduled"]
    parked = answers["/api/parked"].json()
    assert [(p["message_id"], p["reason"]) for p in parked["items"]] == [
        (f"parked-{message_id}", "handler gave up")
    ]
    schedules = answers["/api/recurring"].json()["schedules"]
    assert [(s["name"], s["state"], s["timezone"]) for s in schedules] == [
        (f"{dest}-nightly", "active", "UTC")
    ]

    # an action's answer, and an error's, hold no secret either
    done = client.post(f"/api/scheduled/{message_id}/cancel")
    assert done.status_code == 200 and done.json()["outcome"] == "cancelled", done.text
    for secret in SECRETS:
        assert secret not in done.text


def test_the_login_is_asked_for_and_never_echoed(
    shared_topology: TestTopology, dashboard: Dashboards
) -> None:
    base = shared_topology.settings([shared_topology.dest("dash")])
    settings = _settings(base, base.urls[0], dashboard_token=TOKEN)
    client = dashboard(settings)
    assert client.get("/api/overview").status_code == 401
    page = client.get("/scheduled", follow_redirects=False)
    assert page.status_code == 303 and page.headers["location"] == "/login?next=/scheduled"
    form = client.get("/login")
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
    assert csrf is not None
    wrong = client.post("/login", data={"token": "nope", "csrf_token": csrf[1], "next": "/"})
    assert wrong.status_code == 401 and "nope" not in wrong.text
    right = client.post(
        "/login",
        data={"token": TOKEN, "csrf_token": csrf[1], "next": "//evil.example/"},
        follow_redirects=False,
    )
    assert right.status_code == 303 and right.headers["location"] == "/"
    assert TOKEN not in right.headers.get("set-cookie", "")
    assert client.get("/api/recurring").status_code == 200


def _csrf(client: TestClient, path: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).text)
    assert found is not None, f"no form on {path}"
    return found[1]


def test_a_cross_site_post_is_refused(shared_topology: TestTopology, dashboard: Dashboards) -> None:
    dest = shared_topology.dest("dash")
    settings = _settings(shared_topology.settings([dest]), shared_topology.shared.amqp_url)
    message_id = f"dash-{uuid.uuid4().hex[:8]}"
    with Publisher(settings) as publisher:
        publisher.publish(dest, b"x", delay="30m", message_id=message_id)
    client = dashboard(settings)
    token = _csrf(client, f"/scheduled/{message_id}")
    cancel = f"/scheduled/{message_id}/cancel"

    evil = client.post(
        cancel, data={"csrf_token": token}, headers={"Origin": "http://evil.example"}
    )
    assert evil.status_code == 403 and "cross-site" in evil.text
    referer = {"Referer": "http://evil.example/page"}
    assert client.post(cancel, data={"csrf_token": token}, headers=referer).status_code == 403
    no_token = client.post(cancel, headers={"Origin": "http://testserver"})
    assert no_token.status_code == 403 and "CSRF token" in no_token.text
    forged = client.post(f"/api{cancel}", data={"csrf_token": "forged" * 8})
    assert forged.status_code == 403
    other = dashboard(settings)  # another browser: its own cookie
    assert other.post(cancel, data={"csrf_token": token}).status_code == 403
    assert client.get(f"/api/scheduled/{message_id}").json()["pending"] is True

    same = client.post(cancel, data={"csrf_token": token}, headers={"Origin": "http://testserver"})
    assert same.status_code == 200 and "cancelled" in same.text, same.text
    assert client.get(f"/api/scheduled/{message_id}").json()["pending"] is False


def test_a_page_numbers_the_copies_of_an_id(
    shared_topology: TestTopology, dashboard: Dashboards
) -> None:
    """An id published twice waits as two copies: each row says which it is, of how many."""
    dest = shared_topology.dest("dash")
    settings = _settings(shared_topology.settings([dest]), shared_topology.shared.amqp_url)
    message_id = f"dash-{uuid.uuid4().hex[:8]}"
    with Publisher(settings) as publisher:
        publisher.publish(dest, b"later", delay="40m", message_id=message_id)
        publisher.publish(dest, b"sooner", delay="30m", message_id=message_id)
        publisher.publish(dest, b"alone", delay="35m", message_id=f"{message_id}-other")
    client = dashboard(settings)
    rows = client.get(f"/api/scheduled?destination={dest}").json()["rows"]
    assert [(r["message_id"], r["copy"], r["copies"]) for r in rows] == [
        (message_id, 1, 2),
        (f"{message_id}-other", 1, 1),
        (message_id, 2, 2),
    ]
    page = client.get(f"/scheduled?destination={dest}")
    assert page.status_code == 200 and "1/2" in page.text and "2/2" in page.text


def test_read_only_mode_refuses_every_action(
    shared_topology: TestTopology, dashboard: Dashboards
) -> None:
    dest = shared_topology.dest("dash")
    settings = _settings(
        shared_topology.settings([dest]), shared_topology.shared.amqp_url, dashboard_read_only=True
    )
    message_id = f"dash-{uuid.uuid4().hex[:8]}"
    with Publisher(settings) as publisher:
        publisher.publish(dest, b"x", delay="30m", message_id=message_id)
    client = dashboard(settings)
    page = client.get(f"/scheduled/{message_id}")
    assert page.status_code == 200 and "read-only" in page.text and 'id="cancel"' not in page.text
    token = re.search(r"rmqdelay_csrf=([^;]+)", page.headers["set-cookie"])
    assert token is not None
    for path in (
        f"/api/scheduled/{message_id}/cancel",
        f"/api/scheduled/{message_id}/reschedule",
        "/api/parked/replay",
        "/api/parked/purge",
        "/api/recurring/x/pause",
    ):
        refused = client.post(path, data={"csrf_token": token[1], "mode": "now"})
        assert refused.status_code == 403, path
        assert "read-only" in refused.json()["text"]
    assert client.get(f"/api/scheduled/{message_id}").json()["pending"] is True


def test_a_read_only_broker_user_sees_the_pages_and_is_told_why_actions_fail(
    shared_topology: TestTopology,
    admin: BrokerAdmin,
    amqp_url: str,
    prefix: str,
    dashboard: Dashboards,
) -> None:
    dest = shared_topology.dest("dash")
    base = shared_topology.settings([dest])
    message_id = f"dash-{uuid.uuid4().hex[:8]}"
    recurring = f"{dest}-hourly"
    with Publisher(base) as publisher:
        publisher.publish(dest, b"x", delay="30m", message_id=message_id)
        publisher.add_recurring(recurring, dest, b"tick", every="1h")
    park(base, dest, f"parked-{message_id}")
    name = f"{prefix}-viewer"
    admin.add_user(name, PASSWORD, "^$", "^$", ".*")
    admin._send("PUT", f"users/{admin._q(name)}", {"password": PASSWORD, "tags": "monitoring"})
    try:
        settings = _settings(base, with_login(amqp_url, name, PASSWORD))
        client = dashboard(settings)
        _sees_everything(client, dest, message_id, recurring)
        _refused_as(client, message_id)
    finally:
        admin.delete_user(name)
    with Publisher(base) as publisher:  # refused: still scheduled
        (result,) = publisher.cancel(message_id)
        publisher.remove_recurring(recurring)
    assert result.outcome == "cancelled"


def _sees_everything(client: TestClient, dest: str, message_id: str, recurring: str) -> None:
    """Every page answers a user who may only read, the schedule's among them: the
    journal is followed without the marker it may not write, and the pages say that
    they may still be catching up."""
    for path in ("/", "/parked", "/scheduled", "/recurring", f"/scheduled/{message_id}"):
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.text[:300])
        assert PASSWORD not in answer.text
    assert f"parked-{message_id}" in client.get("/parked").text
    scheduled = client.get("/api/scheduled", params={"destination": dest})
    assert scheduled.status_code == 200, scheduled.text
    assert [r["message_id"] for r in scheduled.json()["rows"] if r["key"] is None] == [message_id]
    assert "may still be catching up" in scheduled.json()["note"]
    assert 'id="catching-up"' in client.get("/scheduled").text
    overview = client.get("/api/overview").json()
    assert overview["schedule"]["problem"] is None, overview["schedule"]
    assert overview["schedule"]["by_destination"][dest] == 2  # the message, the occurrence
    assert overview["parked_by_destination"] is not None
    listed = client.get("/api/recurring").json()["schedules"]
    assert [(s["name"], s["state"]) for s in listed if s["name"] == recurring] == [
        (recurring, "active")
    ]
    assert client.get(f"/api/scheduled/{message_id}").json()["pending"] is True


def _refused_as(client: TestClient, message_id: str) -> None:
    token = _csrf(client, "/parked")
    refused = client.post(f"/api/scheduled/{message_id}/cancel", data={"csrf_token": token})
    assert refused.status_code == 403, refused.text
    assert "lacks the permission" in refused.json()["text"]
    assert "ACCESS_REFUSED" in refused.json()["text"]
    page = client.post(f"/scheduled/{message_id}/cancel", data={"csrf_token": token})
    assert page.status_code == 403 and "lacks the permission" in page.text
    replay = client.post("/api/parked/replay", data={"csrf_token": token})
    job = _finished(client, replay.json()["job"])
    assert not job["outcome"]["ok"]
    assert "lacks the permission" in job["outcome"]["text"], job
    assert f"parked-{message_id}" in client.get("/parked").text  # still parked


def _finished(client: TestClient, job_id: str, within_s: float = 30.0) -> dict[str, Any]:
    """The job's JSON once it is done (polled: it runs on the dashboard's loop)."""
    deadline = time.monotonic() + within_s
    while True:
        job: dict[str, Any] = client.get(f"/api/jobs/{job_id}").json()
        if job["done"]:
            return job
        assert time.monotonic() < deadline, f"job {job_id} not done in {within_s} s: {job}"
        time.sleep(0.05)


def test_each_action_is_reported_back_in_words(shared_topology: TestTopology) -> None:
    dest = shared_topology.dest("dash")
    settings = _settings(shared_topology.settings([dest]), shared_topology.shared.amqp_url)
    ids = [f"dash-{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
    name = f"{dest}-half-hourly"
    with Publisher(settings) as publisher:
        for message_id in ids:
            publisher.publish(dest, b"x", delay="20m", message_id=message_id)
        publisher.add_recurring(name, dest, b"tick", every="30m")
    park(settings, dest, f"parked-{ids[0]}")
    park(settings, dest, f"parked-{ids[1]}")
    port = _metrics_port()
    with TestClient(
        create_app(settings.replace(dashboard_worker_metrics=[f"http://127.0.0.1:{port}/metrics"]))
    ) as client:
        token = _csrf(client, "/parked")

        def post(path: str, **form: str) -> Any:
            return client.post(f"/api{path}", data={"csrf_token": token, **form})

        later = post(f"/scheduled/{ids[0]}/reschedule", mode="at", at="40m")
        assert later.status_code == 200 and later.json()["outcome"] == "rescheduled", later.text
        assert "the waiting copy is forwarded" in later.json()["text"]
        now = post(f"/scheduled/{ids[1]}/reschedule", mode="now")
        assert now.json()["outcome"] == "rescheduled" and now.json()["fresh_copy"] is True
        hour = post(f"/scheduled/{ids[2]}/reschedule", mode="plus1h")
        assert hour.status_code == 400 and "max_delay" in hour.json()["text"], hour.text
        bad = post(f"/scheduled/{ids[2]}/reschedule", mode="at", at="tomorrow-ish")
        assert bad.status_code == 400 and "neither a duration" in bad.json()["text"]
        page = client.post(
            f"/scheduled/{ids[2]}/reschedule", data={"csrf_token": token, "mode": "sideways"}
        )
        assert page.status_code == 400 and "choose how to reschedule" in page.text

        assert post(f"/recurring/{name}/pause").json()["outcome"] == "paused"
        assert post(f"/recurring/{name}/resume").json()["outcome"] == "resumed"
        run = post(f"/recurring/{name}/run")
        assert run.json()["outcome"] == "rescheduled", run.text
        assert post("/recurring/no-such/pause").json()["outcome"] == "unknown"
        assert post(f"/recurring/{name}/explode").status_code == 400

        unconfirmed = post("/parked/purge", message_id=f"parked-{ids[0]}")
        assert unconfirmed.status_code == 400 and "confirm" in unconfirmed.json()["text"]
        purge = post("/parked/purge", message_id=f"parked-{ids[0]}", confirm="yes")
        assert _finished(client, purge.json()["job"])["outcome"]["text"].startswith(
            f"purged 1 parked message(s) with id 'parked-{ids[0]}'"
        )
        assert client.get("/api/overview").json()["parked_by_destination"] == {dest: 1}
        replay = post("/parked/replay", destination=dest)
        replayed = _finished(client, replay.json()["job"])["outcome"]
        assert replayed["ok"] and replayed["replayed"] == 1, replayed
        assert client.get("/api/overview").json()["parked_by_destination"] == {}
        page = client.post(
            "/parked/replay",
            data={"csrf_token": token, "message_id": "gone"},
            follow_redirects=False,
        )
        assert page.status_code == 303 and page.headers["location"].startswith("/jobs/")
        job_page = client.get(page.headers["location"])
        assert job_page.status_code == 200
        job = _finished(client, page.headers["location"].rsplit("/", 1)[-1])
        assert "gone: not found in the parking queue" in job["outcome"]["text"]
        assert client.get("/jobs/999").status_code == 404

        workers = client.get("/api/overview").json()["workers"]
        assert [w["up"] for w in workers] == [True]
    with Publisher(settings) as publisher:
        publisher.remove_recurring(name)


def _metrics_port() -> int:
    """A Prometheus page of this process's metrics (the worker's, as it serves them)."""
    import socket

    from prometheus_client import start_http_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    start_http_server(port, addr="127.0.0.1")
    return port


def test_the_command_serves_it_and_logs_no_secret(
    shared_topology: TestTopology, amqp_url: str, user: str
) -> None:
    dest = shared_topology.dest("dash")
    base = shared_topology.settings([dest])
    url = with_login(amqp_url, user, PASSWORD)
    message_id = f"dash-{uuid.uuid4().hex[:8]}"
    with Publisher(_settings(base, url)) as publisher:
        publisher.publish(dest, b"x", delay="30m", message_id=message_id)
    port = _free_port()
    env = rmqdelay_env(
        url,
        base.prefix,
        max_delay="1h",
        connection_name=base.connection_name,
        dashboard_token=TOKEN,
    )
    server = subprocess.Popen(
        [*CLI, "dashboard", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                rows = _call(f"{base_url}/api/scheduled?id={message_id}")["rows"]
                break
            except OSError:  # not listening yet
                pass
            assert server.poll() is None, server.communicate()
            assert time.monotonic() < deadline, "the dashboard did not answer within 30 s"
            time.sleep(0.1)
        assert [r["message_id"] for r in rows] == [message_id]
        with pytest.raises(urllib.error.HTTPError) as unauthorized:
            _call(f"{base_url}/api/overview", token=None)
        assert unauthorized.value.code == 401
        done = _call(f"{base_url}/api/scheduled/{message_id}/cancel", post=True)
        assert done["outcome"] == "cancelled", done
    finally:
        server.terminate()
        out, err = server.communicate(timeout=30)
    said = out + err
    assert f"rmqdelay dashboard on http://127.0.0.1:{port}/ (a token)" in said, said
    assert f"/api/scheduled/{message_id}/cancel: {message_id}: cancelled" in said, said
    for secret in SECRETS:
        assert secret not in said


def _call(url: str, *, token: str | None = TOKEN, post: bool = False) -> Any:
    """The JSON of a dashboard's answer over HTTP (as a script calls its API)."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(
        url, data=b"" if post else None, headers=headers, method="POST" if post else "GET"
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_checkpoint_is_read_off_the_event_loop_and_the_page_says_how_far_it_is(
    shared_topology: TestTopology, dashboard: Dashboards, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading a big checkpoint into the store takes seconds: it runs in a worker thread
    (held here until the test lets it go), and meanwhile the loop serves every page: the
    Scheduled page's first page read as ``scheduled list --limit`` reads it, saying what
    it reads; a filter or another order waits for the store."""
    dest = shared_topology.dest("dash")
    settings = _settings(shared_topology.settings([dest]), shared_topology.shared.amqp_url)
    ids = [f"dash-{n}-{uuid.uuid4().hex[:6]}" for n in range(3)]
    with Publisher(settings) as publisher:
        for message_id in ids:
            publisher.publish(dest, b"x", delay="20m", message_id=message_id)
    loading, release = threading.Event(), threading.Event()
    load = StoreFollower._load_checkpoint

    def held(self: StoreFollower) -> Any:
        loading.set()
        assert release.wait(60), "the test never let the load go"
        return load(self)

    monkeypatch.setattr(StoreFollower, "_load_checkpoint", held)
    monkeypatch.setattr(schedule_source, "READY_WAIT_S", 0.1)
    try:
        client = dashboard(settings)  # its start-up reads the checkpoint, then the journal
        assert loading.wait(60), "the load never started"
        page = client.get("/scheduled", params={"limit": 1000})
        assert page.status_code == 200, page.text[:300]
        assert "reading the schedule: the latest checkpoint" in page.text, page.text[:500]
        assert all(message_id in page.text for message_id in ids)
        first = client.get("/api/scheduled", params={"limit": 1000})
        assert first.status_code == 200 and first.json()["total"] is None, first.text[:300]
        with Publisher(settings) as publisher:
            listed = [r.message_id for r in publisher.list_scheduled(limit=1000)]
        assert [r["message_id"] for r in first.json()["rows"]] == listed
        api = client.get("/api/scheduled", params={"destination": dest})
        assert api.status_code == 503 and api.json()["loading"] is True, api.text
        assert "reading the schedule" in client.get("/api/overview").json()["schedule"]["problem"]
        assert client.get("/login").status_code == 200
        assert client.get("/parked").status_code == 200
    finally:
        release.set()
    deadline = time.monotonic() + 30
    while (answer := client.get("/api/scheduled", params={"destination": dest})).status_code == 503:
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.05)
    assert sorted(r["message_id"] for r in answer.json()["rows"]) == sorted(ids)


def test_a_restarted_dashboard_reads_on_from_its_saved_store(
    shared_topology: TestTopology, dashboard: Dashboards, tmp_path: Any
) -> None:
    """The store is a file: a dashboard started again opens it and reads only the
    journal written since; what changed meanwhile (a cancel, a publish) shows."""
    dest = shared_topology.dest("dash")
    state = tmp_path / "dashboard.sqlite3"
    settings = _settings(
        shared_topology.settings([dest]), shared_topology.shared.amqp_url, dashboard_state=state
    )
    with Publisher(settings) as publisher:
        first = [publisher.publish(dest, b"x", delay="20m") for _ in range(3)]
    with TestClient(create_app(settings)) as client:
        rows = _rows(client, dest)
        assert sorted(rows) == sorted(r.message_id for r in first)
    assert state.is_file()
    with Publisher(settings) as publisher:
        publisher.cancel(first[0].message_id)
        later = publisher.publish(dest, b"y", delay="10m")
    with TestClient(create_app(settings)) as client:
        rows = _rows(client, dest)
        assert sorted(rows) == sorted([later.message_id, *(r.message_id for r in first[1:])])


def _rows(client: TestClient, dest: str) -> list[str]:
    deadline = time.monotonic() + 30
    while (answer := client.get("/api/scheduled", params={"destination": dest})).status_code == 503:
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.05)
    assert answer.status_code == 200, answer.text
    return [r["message_id"] for r in answer.json()["rows"]]
