"""No password in settings errors, reprs, masked URLs or worker log lines (no broker).

The broker-side half, every connect failure and the CLI: tests/broker/test_secrets.py.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rmqdelay import Settings, load_settings
from rmqdelay.errors import RmqDelayError
from rmqdelay.settings import mask_url
from rmqdelay.worker.logs import StructuredFormatter


@pytest.fixture
def secret() -> str:
    return uuid.uuid4().hex


def assert_hidden(secret: str, *texts: object) -> None:
    for text in texts:
        assert secret not in str(text), str(text)


def error_of(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except (ValidationError, RmqDelayError, ValueError) as exc:
        return exc
    raise AssertionError("no error")


def test_settings_errors_and_repr_hide_the_password(secret: str, tmp_path: Path) -> None:
    url = f"amqp://u:{secret}@h:5672/%2F"
    failing: list[Callable[[], Any]] = [
        lambda: Settings(url=url, radix=99),  # a field error
        lambda: Settings(url=url, max_delay="1000000d"),  # a model error: all inputs at once
        lambda: Settings(url=url, bogus=1),  # type: ignore[call-arg]  # an unknown field
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
