"""No password, anywhere: every failure is provoked with a URL whose password is unique,
and every output is searched for it (exception text and repr, logs, stdout, stderr).

Settings errors, ``mask_url`` and the log formatter: tests/unit/test_secret_masking.py."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from broker import BrokerInfo

from rmqdelay import Settings
from rmqdelay.amqp.connections import connect_async, connect_blocking
from rmqdelay.amqp.publisher import Publisher
from rmqdelay.errors import RmqDelayError
from rmqdelay.settings import mask_url
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.cli import CLI, rmqdelay_env, run_cli
from tests.helpers.hidden import assert_hidden, error_of
from tests.helpers.support import closed_port

WORKER_APP = """\
from rmqdelay import Worker

app = Worker()


@app.handler("jobs")
async def handle(body: bytes) -> None:
    pass
"""


WORKER_CMD = (*CLI, "worker", "secret_app:app")


@pytest.fixture
def secret() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def user(admin: BrokerAdmin, prefix: str, secret: str) -> Iterator[str]:
    """A real user whose password is the secret (the prefix fixture deletes it)."""
    name = f"{prefix}-secret"
    admin.add_user(name, secret, ".*", ".*", ".*")
    yield name


def url_of(amqp_url: str, user: str, password: str, vhost: str | None = None) -> str:
    parts = urlsplit(str(amqp_url))
    netloc = f"{user}:{password}@{parts.hostname}:{parts.port or 5672}"
    return urlunsplit(parts._replace(netloc=netloc, path=parts.path if vhost is None else vhost))


# --------------------------------------------------------------------------- the library


async def test_connection_errors_hide_the_password(
    amqp_url: str, secret: str, user: str, prefix: str
) -> None:
    good_user = urlsplit(str(amqp_url)).username or "guest"
    urls = [
        url_of(amqp_url, good_user, secret),  # wrong password
        url_of(amqp_url, user, secret, f"/{prefix}-nowhere"),  # unknown vhost
        f"amqp://{user}:{secret}@127.0.0.1:1/%2F,amqp://{user}:{secret}@127.0.0.1:2/%2F",
    ]
    bad_port = error_of(lambda: Settings(url=f"amqp://{user}:{secret}@127.0.0.1:99999/%2F"))
    assert "has a bad port" in str(bad_port)  # refused when read, before pika sees it
    assert_hidden(secret, bad_port, repr(bad_port))
    for url in urls:
        settings = Settings(url=url, prefix=prefix)
        sync = error_of(lambda s=settings: connect_blocking(s, "test"))  # type: ignore[misc]
        try:
            await connect_async(settings, "test")
        except RmqDelayError as exc:
            assert_hidden(secret, sync, repr(sync), exc, repr(exc))
        else:
            raise AssertionError(f"connected to {mask_url(url)}")


def test_a_failed_publish_hides_the_password(secret: str, user: str, amqp_url: str) -> None:
    settings = Settings(url=url_of(amqp_url, user, secret), max_delay="1h")
    with Publisher(settings) as publisher:
        exc = error_of(lambda: publisher.publish("jobs", b"x", delay="1e400"))
    assert "over the maximum" in str(exc)
    assert_hidden(secret, exc, repr(exc))


# --------------------------------------------------------------------------- the CLI


def run(env: dict[str, str], *args: str, cwd: Path | None = None) -> str:
    """Run the CLI; everything it printed, stdout and stderr."""
    result = run_cli(env, *args, cwd=cwd)
    assert result.returncode != 0, (args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout + result.stderr


def test_no_cli_error_prints_the_password(
    amqp_url: str, admin: BrokerAdmin, prefix: str, secret: str, user: str, tmp_path: Path
) -> None:
    env = rmqdelay_env(prefix=prefix, max_delay="1h")
    good = url_of(amqp_url, user, secret)
    wrong = url_of(amqp_url, urlsplit(str(amqp_url)).username or "guest", secret)
    config = tmp_path / "rmqdelay.toml"
    config.write_text("radix = 17\n")
    broken = tmp_path / "broken.toml"
    broken.write_text(f'url = "{good}"\nradix = [\n')
    cases: list[tuple[str, ...]] = [
        ("topology", "plan", "--url", wrong),
        ("topology", "plan", "--url", url_of(amqp_url, user, secret, f"/{prefix}-nowhere")),
        ("topology", "plan", "--url", f"http://u:{secret}@foo"),
        ("topology", "plan", "--url", f"amqp://g:{secret}@127.0.0.1:5999/,{wrong}"),
        ("topology", "plan", "--url", f"amqp://u:{secret}@127.0.0.1:1/,u:{secret}@h"),
        ("topology", "plan", "--url", f"amqp://u:{secret}@127.0.0.1:99999/%2F"),
        ("topology", "plan", "--url", good, "--prefix", "a.b"),
        ("topology", "plan", "--url", good, "--config", str(config)),
        ("topology", "plan", "--config", str(broken)),
        ("parked", "list", "--url", wrong),
        ("parked", "list", "--url", url_of(amqp_url, user, secret, f"/{prefix}-nowhere")),
        ("publish", "jobs", "x", "--delay", "1e400", "--url", good),
        ("publish", "jobs", "x", "--delay", "1s", "--url", wrong),
        ("consume", "jobs", "--timeout", "1", "--url", wrong),
        ("status", "--url", wrong),
        ("scheduled", "list", "--url", wrong),
    ]
    for args in cases:
        assert_hidden(secret, run(env, *args))


def test_the_worker_never_logs_the_password(
    amqp_url: str, secret: str, user: str, prefix: str, tmp_path: Path
) -> None:
    (tmp_path / "secret_app.py").write_text(WORKER_APP)
    env = rmqdelay_env(prefix=prefix)
    wrong = url_of(amqp_url, urlsplit(str(amqp_url)).username or "guest", secret)
    for url in (wrong, url_of(amqp_url, user, secret)):  # wrong password; no work queue
        said = run({**env, "RMQDELAY_URL": url}, "worker", "secret_app:app", cwd=tmp_path)
        assert "error:" in said
        assert_hidden(secret, said)
    # a refused address: it retries, logging each attempt (DEBUG: every library's lines)
    said = _retrying_worker_log(
        {**env, "RMQDELAY_URL": f"amqp://u:{secret}@127.0.0.1:1/%2F"}, tmp_path, "json"
    )
    assert "127.0.0.1:1" in said
    assert_hidden(secret, said)


def _retrying_worker_log(env: dict[str, str], cwd: Path, log_format: str) -> str:
    """Run ``WORKER_CMD`` at DEBUG until it has logged two reconnect attempts (its URLs
    refuse), stop it with SIGTERM (it must exit 0), and return what it logged."""
    log = cwd / "worker.log"
    with log.open("w") as out:
        worker = subprocess.Popen(
            [*WORKER_CMD, "--log-level", "DEBUG", "--log-format", log_format],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while log.read_text().count("retrying in") < 2:
            assert worker.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(10) == 0, log.read_text()
    return log.read_text()


# --------------------------------------------------------------------------- several URLs


def test_several_urls_each_with_its_own_password_never_show(
    amqp_url: str, broker: BrokerInfo, user: str, secret: str, prefix: str, tmp_path: Path
) -> None:
    """Two refused addresses, then a refused login, each with a password of its own,
    and management URLs with theirs: no output of the library, the CLI or the worker
    shows any of them."""
    passwords = [*(uuid.uuid4().hex for _ in range(5)), secret]
    good_user = urlsplit(str(amqp_url)).username or "guest"
    urls = [
        f"amqp://a:{passwords[0]}@127.0.0.1:1/%2F",
        f"amqp://b:{passwords[1]}@127.0.0.1:2/%2F",
        url_of(amqp_url, good_user, passwords[2]),  # the broker refuses the login
    ]
    closed = f"http://m:{passwords[3]}@127.0.0.1:{closed_port()}"

    def hidden(*texts: object) -> None:
        for password in passwords:
            assert_hidden(password, *texts)

    settings = Settings(url=urls, management_url=closed, prefix=prefix, max_delay="1h")
    sync = error_of(lambda: connect_blocking(settings, "test"))
    assert "refused the login" in str(sync)
    hidden(sync, repr(sync), settings, settings.to_json())

    env = rmqdelay_env(",".join(urls), prefix, max_delay="1h", management_url=closed)
    for args in (
        ("topology", "verify", "-d", "jobs"),
        ("topology", "plan"),
        ("status",),
        ("status", "--json"),
        ("scheduled", "list"),
        ("parked", "list"),
        ("publish", "jobs", "x", "--delay", "1s"),
        ("cancel", "some-id"),
    ):
        hidden(run(env, *args))

    # the AMQP side works (the last URL logs in), the management URLs do not: one does not
    # answer, the other refuses its own credentials
    urls[2] = url_of(amqp_url, user, secret)
    if broker.management_url:
        parts = urlsplit(broker.management_url)
        refused = parts._replace(netloc=f"m:{passwords[4]}@{parts.netloc}").geturl()
        env |= {"RMQDELAY_URL": ",".join(urls), "RMQDELAY_MANAGEMENT_URL": f"{closed},{refused}"}
        said = run(env, "topology", "verify", "-d", "jobs")
        assert "refused the credentials (HTTP 401)" in said and "is unreachable" in said
        hidden(said)

    # the worker, retrying the refused addresses (DEBUG: every library's lines)
    (tmp_path / "secret_app.py").write_text(WORKER_APP)
    env["RMQDELAY_URL"] = ",".join(urls[:2])
    said = _retrying_worker_log(env, tmp_path, "text")
    assert "127.0.0.1:1" in said and "127.0.0.1:2" in said
    hidden(said)
