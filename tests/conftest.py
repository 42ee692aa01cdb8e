"""Shared pytest fixtures.

Broker fixtures (this section): ``broker``, ``amqp_url``, ``admin``, ``prefix``.
A missing broker skips broker tests locally but FAILS them when ``$CI`` is set.
Add further fixtures in their own section below.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT / "scripts", Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from broker import BrokerInfo, BrokerUnavailable, SecretUrl, ensure_broker  # noqa: E402
from brokerctl import BrokerAdmin, make_prefix  # noqa: E402

# --------------------------------------------------------------------------- broker


@pytest.fixture(scope="session")
def broker() -> Iterator[BrokerInfo]:
    """The broker for this test session (see scripts/broker.py for where it comes from)."""
    with ExitStack() as stack:
        try:
            info = stack.enter_context(ensure_broker())
        except BrokerUnavailable as exc:
            if os.environ.get("CI"):
                pytest.fail(
                    f"CI needs a RabbitMQ broker and none could be had:\n{exc}", pytrace=False
                )
            pytest.skip(f"no RabbitMQ broker: {str(exc).splitlines()[0]} (see scripts/broker.py)")
        yield info


@pytest.fixture(scope="session")
def amqp_url(broker: BrokerInfo) -> str:
    """amqp:// URL of the session's broker.  Its repr() masks the password, so pytest's
    tracebacks don't show it; str() is the real URL (don't print that)."""
    return SecretUrl(broker.url)


@pytest.fixture(scope="session")
def admin(broker: BrokerInfo) -> BrokerAdmin:
    """Management API / rabbitmqctl helper for the session's broker."""
    return BrokerAdmin(broker.url, broker.management_url)


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique name prefix for this test's queues, exchanges, users and connections.

    Name entities ``prefix`` or ``prefix + ".<something>"``: after the test, those queues
    and exchanges (and users whose name starts with ``prefix``) are deleted -- when the
    test used the broker at all.
    """
    value = make_prefix(request.node.name)
    # A test that never touches the broker (no "broker" in its fixture closure) gets a
    # prefix without needing one; the others get their entities cleaned up afterwards.
    admin: BrokerAdmin | None = None
    if "broker" in request.fixturenames:
        admin = request.getfixturevalue("admin")
    yield value
    if admin is not None:
        try:
            admin.cleanup_prefix(value)
        except Exception as exc:  # a broken broker must not hide the test's own result
            warnings.warn(f"cleanup of {value}.* failed: {exc!r}", stacklevel=1)


# --------------------------------------------------------------------------- markers


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by its folder: ``unit`` needs no broker, ``broker`` needs one."""
    for item in items:
        parts = item.path.parts
        if "unit" in parts:
            item.add_marker(pytest.mark.unit)
        elif "broker" in parts:
            item.add_marker(pytest.mark.broker)
