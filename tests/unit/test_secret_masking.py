"""No password in settings errors, reprs, dumps, masked URLs, worker log lines or the
management API's requests (a stand-in API on 127.0.0.1; no broker).

The broker-side half, every connect failure and the CLI: tests/broker/test_secrets.py.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rmqdelay import Settings, load_settings
from rmqdelay.amqp.management import ManagementApi
from rmqdelay.settings import mask_url
from rmqdelay.worker.logs import StructuredFormatter
from tests.helpers.hidden import assert_hidden, error_of
from tests.helpers.support import closed_port


@pytest.fixture
def secret() -> str:
    return uuid.uuid4().hex


def test_settings_errors_and_repr_hide_the_password(secret: str, tmp_path: Path) -> None:
    url = f"amqp://u:{secret}@h:5672/%2F"
    failing: list[Callable[[], Any]] = [
        lambda: Settings(url=url, radix=99),  # a field error
        lambda: Settings(url=url, max_delay="1000000d"),  # a model error: all inputs at once
        lambda: Settings(url=url, bogus=1),  # an unknown field
        lambda: Settings(url=f"http://u:{secret}@h/"),  # the URL itself
        lambda: Settings(url=f"{url},http://u:{secret}@h2/"),
        lambda: Settings(url=f"{url},amqps://u:{secret}@h2/"),
        lambda: Settings(url=url, management_url=f"ftp://u:{secret}@h/"),
        lambda: Settings(url=url, prefix="a.b"),
    ]
    config = tmp_path / "bad.toml"
    config.write_text(f'url = "{url}"\nradix = [\n')
    failing.append(lambda: load_settings(config))
    for call in failing:
        exc = error_of(call)
        assert_hidden(secret, exc, repr(exc))
    settings = Settings(url=f"{url},amqp://v:{secret}@h2/")
    assert_hidden(secret, settings, repr(settings), settings.masked_url)
    assert settings.masked_url.count(":***@") == 2


@pytest.mark.parametrize(
    "url",
    [
        "amqp://u:{s}@h/",
        "amqp://u:{s}/x@h/",  # a raw '/' in the password
        "amqp://u:x,{s}@h/,amqp://v:{s}@h2/",  # a raw ',' in a list
        "amqp://u:{s}@h:99999/",  # a port that does not parse
        "amqp://u:p@{s}@h/",  # a raw '@'
        "amqp://u:p@x/{s}@h/",  # a raw '@', then a raw '/'
    ],
)
def test_mask_url_hides_passwords_that_do_not_parse(url: str, secret: str) -> None:
    assert_hidden(secret, mask_url(url.format(s=secret)))


def test_the_log_formatter_hides_every_password_of_a_list(secret: str) -> None:
    url = f"amqp://u:{secret}@h1/%2F,amqp://u:{secret[::-1]}@h2/%2F"
    formatter = StructuredFormatter("text", url)
    record = logging.LogRecord(
        "aiormq", logging.ERROR, __file__, 1, "to %s; h2 said :%s@", (url, secret[::-1]), None
    )
    record.__dict__["url"] = url
    line = formatter.format(record)
    assert_hidden(secret, line)
    assert_hidden(secret[::-1], line)


# --------------------------------------------------------------------------- several URLs


class _Recorder(BaseHTTPRequestHandler):
    """A stand-in management API on 127.0.0.1 that keeps every request it gets."""

    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen.append(f"{self.requestline}\n{self.headers}")
        answer: object = []
        if self.path.startswith("/api/overview"):
            answer = {"rabbitmq_version": "4.0.5", "cluster_name": "rmqd-c4-1@vm"}
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[int, list[str]]]:
    """(port, requests seen) of a stand-in management API."""
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


def test_no_password_of_several_urls_in_any_output(recorder: tuple[int, list[str]]) -> None:
    """Each URL has its own password, the management URLs theirs: none shows anywhere."""
    port, seen = recorder
    p1, p2, p3, pm = (uuid.uuid4().hex for _ in range(4))
    amqp = [f"amqp://u:{p1}@127.0.0.1:1/%2F", f"amqp://v:{p2}@127.0.0.1:2/%2F"]
    amqp.append(f"amqp://w:{p3}@localhost:3/%2F")
    dead = f"http://m:{pm}@127.0.0.1:{closed_port()}"
    management = [dead, f"http://m:{pm}@127.0.0.1:{port}/"]
    secrets = (p1, p2, p3, pm)
    settings = Settings(url=amqp, management_url=management)

    def hidden(*texts: object) -> None:
        for secret in secrets:
            assert_hidden(secret, *texts)

    hidden(
        settings,
        repr(settings),
        settings.url,
        repr(settings.url),
        f"{settings.management_url}",
        settings.masked_url,
        settings.as_dict(),
        json.loads(settings.to_json()),
        settings.to_json(),
    )
    assert json.loads(settings.to_json())["management_url"].count(":***@") == 2

    # validation errors: a field's, the model's, a URL's own, and the vhost check
    hidden(
        *(
            error_of(call)
            for call in (
                lambda: Settings(url=amqp, management_url=management, radix=99),
                lambda: Settings(url=amqp, management_url=management, max_delay="1000000d"),
                lambda: Settings(url=[*amqp, f"amqp://x:{pm}@h:5672/other"]),
                lambda: Settings(url=amqp, management_url=[*management, f"ftp://m:{pm}@h"]),
                lambda: Settings(url=[*amqp[:2], f"amqp://w:{p3}@h:99999/%2F"]),
            )
        )
    )

    # worker and CLI log lines: every URL, raw, in a message and a field
    record = logging.LogRecord(
        "aiormq", logging.ERROR, __file__, 1, "to %s and %s", (amqp, management), None
    )
    record.__dict__["url"] = settings.url.get_secret_value()
    for fmt in ("text", "json"):
        formatter = StructuredFormatter(fmt, settings.url, settings.management_url)
        hidden(formatter.format(record))

    # the management API: the first does not answer, the second does; only the vhost of
    # an AMQP URL goes into a request, and the management URL's own credentials
    api = ManagementApi.for_settings(settings)
    assert api.problem is None and api.base == f"http://127.0.0.1:{port}"
    api.queues("rmqdelay.")
    api.exchanges("rmqdelay.")
    api.bindings()
    api.node_names()
    assert [r.split(" ")[1] for r in seen] == [
        "/api/overview",
        "/api/queues/%2F",
        "/api/exchanges/%2F",
        "/api/bindings/%2F",
        "/api/nodes?columns=name",
    ]
    logins = [
        base64.b64decode(line.split("Basic ", 1)[1]).decode()
        for request in seen
        for line in request.splitlines()
        if line.startswith("Authorization:")
    ]
    assert logins == [f"m:{pm}"] * len(seen)
    hidden(*(request.split("\nAuthorization:")[0] for request in seen))
    for secret in (p1, p2, p3):  # nothing of the AMQP URLs but their vhost
        assert_hidden(secret, *seen, *logins)

    # the API's reasons when none answers, and the default API of each AMQP host
    nowhere = ManagementApi(amqp, [dead, f"http://n:{pm}@127.0.0.1:{closed_port()}"])
    assert nowhere.problem is not None and nowhere.problem.count("is unreachable") == 2
    default = ManagementApi(amqp)
    assert default.bases == ["http://127.0.0.1:15672", "http://localhost:15672"]
    hidden(nowhere.problem, nowhere.bases, default.bases)
