"""Checks that a password stays hidden: shared by the unit and broker halves of the
secret tests (tests/unit/test_secret_masking.py, tests/broker/test_secrets.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rmqdelay.errors import RmqDelayError

__all__ = ["assert_hidden", "error_of"]


def assert_hidden(secret: str, *texts: object) -> None:
    """None of ``texts`` (as ``str()`` shows them) holds ``secret``."""
    for text in texts:
        assert secret not in str(text), str(text)


def error_of(call: Callable[[], Any]) -> BaseException:
    """The error ``call`` raises, of the kinds rmqdelay raises for bad input."""
    try:
        call()
    except (RmqDelayError, ValueError) as exc:
        return exc
    raise AssertionError("no error")
