"""Shared pytest fixtures.

Broker fixtures (this section): ``broker``, ``amqp_url``, ``admin``, ``prefix``.
A missing broker skips broker tests locally but FAILS them when ``$CI`` is set.
Add further fixtures in their own section below.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import ExitStack
from types import ModuleType
from typing import Any

import hypothesis
import pytest
from broker import BrokerInfo, BrokerUnavailable, SecretUrl, ensure_broker

from tests.helpers.brokerctl import BrokerAdmin, make_prefix, release_prefix, server_version
from tests.helpers.consumer_timeouts import by_consumer_argument, node_share
from tests.helpers.worker_helpers import SharedTopology, TestTopology, WorkerCase

pytest_plugins = ["tests.helpers.cluster_support"]  # the local_cluster fixture of tests/cluster

# No property here is about speed: hypothesis's 200 ms deadline per example measured the
# machine (a loaded 2-core box failed it at 327 ms), not the code.
hypothesis.settings.register_profile("rmqdelay", deadline=None)
hypothesis.settings.load_profile("rmqdelay")

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
def broker_version(broker: BrokerInfo) -> tuple[int, ...]:
    """The broker's version from its AMQP server properties, e.g. ``(4, 0, 5)``: for
    tests that assert what each RabbitMQ version does (tests/broker/test_broker_versions.py)."""
    return tuple(int(part) for part in re.findall(r"\d+", server_version(broker.url))[:3])


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
        release_prefix(admin, value)


# --------------------------------------------------------------------------- shared topology


@pytest.fixture(scope="module")
def module_topology(
    request: pytest.FixtureRequest, amqp_url: str, admin: BrokerAdmin
) -> Iterator[SharedTopology]:
    """The test module's delay topology (see ``worker_helpers.SharedTopology``), declared
    on first use and deleted after the module's last test."""
    shared = SharedTopology(amqp_url, make_prefix(request.module.__name__.rsplit(".", 1)[-1]))
    yield shared
    for value in shared.prefixes:
        release_prefix(admin, value)


@pytest.fixture
def shared_topology(module_topology: SharedTopology, prefix: str) -> TestTopology:
    """This test's share of the module's topology: destinations and connection names of
    its own (``worker_helpers.TestTopology``); the parking queues start empty."""
    module_topology.purge_parking()
    return TestTopology(module_topology, prefix)


@pytest.fixture
def worker_case(shared_topology: TestTopology) -> WorkerCase:
    """A worker of this test's own, for its destination ``jobs`` on the module's topology
    (``TestTopology.worker``, which takes other destinations and settings)."""
    return shared_topology.worker()


# --------------------------------------------------------------------------- markers


@pytest.fixture(autouse=True)
def _node_share(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test on the broker shares its node with the tests beside it, or has it to itself
    when marked ``whole_node`` on a version whose consumer timeout is node-wide (before
    4.3: consumer_timeouts.py)."""
    if "broker" not in request.fixturenames:
        yield
        return
    info: BrokerInfo = request.getfixturevalue("broker")
    whole = request.node.get_closest_marker("whole_node") is not None
    if whole and by_consumer_argument(request.getfixturevalue("broker_version")):
        whole = False  # its consumer's own timeout: nothing node-wide changes
    with node_share(info.url, whole=whole):
        yield


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by its folder: ``unit`` needs no broker, ``broker`` needs one.

    With ``--dist loadgroup`` (the Makefile's), a broker test file's tests run on one
    pytest-xdist worker, in order, on one module topology; the files and the unit tests
    are spread over the workers. Tests that change the whole node wait for the rest
    (``node_share``)."""
    for item in items:
        parts = item.path.parts
        if "unit" in parts:
            item.add_marker(pytest.mark.unit)
        elif "broker" in parts:
            item.add_marker(pytest.mark.broker)
            item.add_marker(pytest.mark.xdist_group(f"broker-{item.path.name}"))
        elif "cluster" in parts:  # make cluster-test; left out of the default run
            item.add_marker(pytest.mark.cluster)
        elif "browser" in parts:  # make test-browser; left out of the default run
            item.add_marker(pytest.mark.browser)


def _broker_path(item: pytest.Function) -> list[str] | None:
    """How ``item`` reaches the ``broker`` fixture: ``[arg, ..., "broker"]``, or None."""
    defs = item._fixtureinfo.name2fixturedefs
    paths: dict[str, list[str]] = {name: [name] for name in item._fixtureinfo.argnames}
    queue = list(paths)
    while queue:
        name = queue.pop(0)
        if name == "broker":
            return paths[name]
        for dep in defs[name][-1].argnames if name in defs else ():
            if dep not in paths:
                paths[dep] = [*paths[name], dep]
                queue.append(dep)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Keep the split honest: a test under tests/unit must not need the broker."""
    if "unit" in item.path.parts and isinstance(item, pytest.Function):
        path = _broker_path(item)
        if path is not None:
            pytest.fail(
                f"{item.nodeid} is a unit test (tests/unit) but needs the broker fixture "
                f"(through {' -> '.join(path)}): move it to tests/broker, or stop using "
                "that fixture",
                pytrace=False,
            )


# --------------------------------------------------------------------------- scripts/broker.py


@pytest.fixture
def no_broker_here(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """scripts/broker.py on a machine with no env URL, nothing on :5672, no Docker, no
    Debian server and no root."""
    import broker as broker_module
    from brokers import container, debian, find

    monkeypatch.delenv("RMQDELAY_URL", raising=False)
    monkeypatch.setattr(find, "LOCAL_PORT", 1)  # nothing listens on port 1
    monkeypatch.setattr(container, "docker_available", lambda: (False, "no engine"))
    monkeypatch.setattr(debian, "DEBIAN_SERVER", "/nonexistent/rabbitmq-server")
    monkeypatch.setattr(debian, "is_root", lambda: False)
    monkeypatch.setattr(find, "MANAGEMENT_TIMEOUT", 2.0)
    return broker_module


# --------------------------------------------------------------------------- pika's two paths


@pytest.fixture(params=["pika-fast", "pika-public"])
def pika_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a sync publisher test on both of rmqdelay's ways through pika: its fast path
    (pika's internals) and pika's public API, as ``RMQDELAY_CLIENT_FAST=0`` or a failed
    self-check makes it (rmqdelay/amqp/pika_private.py). Select them with
    ``-k pika-fast`` / ``-k pika-public``; "pika-fast" is the public path too when the
    self-check refused the installed pika."""
    if request.param == "pika-public":
        from rmqdelay.amqp import pika_private

        monkeypatch.setattr(pika_private, "FAST", False)
    return str(request.param)


# --------------------------------------------------------------------------- aiormq's two paths


@pytest.fixture(params=["aio-fast", "aio-public"])
def aio_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """For tests whose async publisher sends batches: each runs on the window of frames
    written into aiormq's books, and again with ``RMQDELAY_CLIENT_FAST=0``, aiormq's public
    ``basic_publish`` per message (``-k aio-fast`` / ``-k aio-public`` select one). Checks
    afterwards that the path named was the one taken."""
    from rmqdelay.amqp import aiormq_private

    windows: list[int] = []
    write_window = aiormq_private.write_window

    async def counted(underlay: object, book: Any, messages: Any, route: Any) -> Any:
        windows.append(len(messages))
        return await write_window(underlay, book, messages, route)

    monkeypatch.setattr(aiormq_private, "write_window", counted)
    if request.param == "aio-public":
        monkeypatch.setenv("RMQDELAY_CLIENT_FAST", "0")
    else:
        monkeypatch.delenv("RMQDELAY_CLIENT_FAST", raising=False)
    yield request.param
    if request.param == "aio-public":
        assert not windows, f"RMQDELAY_CLIENT_FAST=0, yet windows of {windows} were written"
    else:
        assert windows, "no window of frames was written: the fast path was not taken"
