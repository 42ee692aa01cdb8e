"""A short consumer timeout for one test, on each RabbitMQ version.

- 4.3 honours the ``x-consumer-timeout`` consumer argument on a quorum queue (the worker's
  ``consumer_timeout``): that consumer alone, checked to the millisecond (measured).
- 4.0.5 ignores that argument on a quorum queue (measured); 3.10 has no per-queue timeout
  at all. Both read the node-wide ``consumer_timeout`` once per channel, when it opens,
  and check it on the channel's tick (``channel_tick_interval``, 60 s). So for those,
  :class:`NodeTimeout` sets ``consumer_timeout`` for a moment while the test's channel
  opens (the node restores it by itself ``WINDOW_MS`` later, the test sooner with
  :meth:`NodeTimeout.unshorten`), and the tick short while the
  test runs (restored after, and by the node itself after ``SAFETY_MS``, should the test
  die). Other channels opened in that moment get the short timeout too: it is a moment.

Changing the node needs ``rabbitmqctl eval`` there: the host's node on :5672 (as root),
or a node in its chroot (``scripts/brokers/chroot.py``: 4.0 on :5682).

A test that does so is marked ``whole_node``: :func:`node_share` (every broker test's,
through ``tests/conftest.py``) lets it run alone on its node while the other tests of the
suite's pytest-xdist workers, and of any suite beside it on that node, wait.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from rmqdelay.worker import WorkerHook
from tests.helpers.brokerctl import BrokerAdmin

WINDOW_MS = 10_000
"""How long the node-wide timeout stays short: the test's channel must open within it.
A worker opens its consuming channel after its other connect hooks (the journal's catch-up
among them): in a CI run with four suites on the 2 cores, 3 s was once not enough, and the
worker's session then never timed out. The tests unshorten it on their next connect."""
SAFETY_MS = 120_000
TICK_MS = 250
SAVED = "rmqdelay_tests_saved"
"""The ``rabbit`` application key that keeps the node's own timeout and tick."""
TOKEN = "rmqdelay_tests_token"
"""The latest :meth:`NodeTimeout.shorten`: an earlier one's timers must not undo it."""


_WHOLE: set[str] = set()
"""The nodes (``host:port``) this process has to itself now (:func:`node_share`)."""


def _node(amqp_url: str) -> str:
    parts = urllib.parse.urlsplit(amqp_url)
    default = 5671 if parts.scheme == "amqps" else 5672
    return f"{parts.hostname or 'localhost'}:{parts.port or default}"


@contextmanager
def node_share(amqp_url: str, *, whole: bool) -> Iterator[None]:
    """Hold the node for one test: shared, or ``whole`` (no other test on it meanwhile).

    A readers-writer lock of two ``flock`` files, so it holds across processes: the
    suite's pytest-xdist workers and the other suites on the node (CI runs ``test-deps``
    beside the 4.3 suite). The gate stops new sharers while a whole-node test waits, so
    it waits for the tests under way only.
    """
    node = _node(amqp_url)
    stem = Path(tempfile.gettempdir()) / f"rmqdelay-tests-{node.replace(':', '-')}"
    with open(f"{stem}.gate", "a") as gate, open(f"{stem}.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if whole else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        if whole:
            _WHOLE.add(node)
        try:
            yield
        finally:
            _WHOLE.discard(node)
            fcntl.flock(lock, fcntl.LOCK_UN)


def by_consumer_argument(version: tuple[int, ...]) -> bool:
    """Whether this version honours the consumer argument on a quorum queue (4.3 on)."""
    return version >= (4, 3)


def _ctl_command(admin: BrokerAdmin) -> list[str] | None:
    """The ``rabbitmqctl`` that administers the test's broker, if this machine has one."""
    if admin.is_local_node:
        ctl = shutil.which("rabbitmqctl")
        return [ctl] if ctl else None
    parts = urllib.parse.urlsplit(admin.amqp_url)
    if parts.hostname not in ("127.0.0.1", "localhost") or os.geteuid() != 0:
        return None
    from brokers.chroot import RELEASES  # scripts/brokers, on the path as the broker fixture's

    for release in RELEASES.values():
        if parts.port == release.amqp_port and (release.root / "usr/sbin/rabbitmqctl").exists():
            return ["chroot", str(release.root), "rabbitmqctl"]
    return None


def _restore(key: str, previous: str) -> str:
    """Erlang: set ``key`` back to what ``application:get_env`` said it was."""
    return (
        f"case {previous} of {{ok, V_{key}}} -> application:set_env(rabbit, {key}, V_{key}); "
        f"undefined -> application:unset_env(rabbit, {key}) end"
    )


class NodeTimeout:
    """The node-wide consumer timeout of a 3.10 or 4.0 broker, made short for a moment."""

    def __init__(self, admin: BrokerAdmin) -> None:
        self.node = _node(admin.amqp_url)
        self.command = _ctl_command(admin)
        self._tick: str | None = None
        """What the tick was: ``{ok,60000}`` or ``undefined``."""
        self._timeout: str | None = None
        """What the timeout was, the same way."""

    def require(self) -> None:
        """Fail (on CI) or skip when this machine cannot change the node's settings."""
        if self.command is None:
            why = "a short consumer timeout before RabbitMQ 4.3 needs rabbitmqctl on its node"
            if os.environ.get("CI"):
                pytest.fail(why, pytrace=False)
            pytest.skip(why)
        if self.node not in _WHOLE:
            pytest.fail(
                "a test that shortens the node-wide consumer timeout changes every channel "
                "opened meanwhile: mark it @pytest.mark.whole_node so it runs alone on its node",
                pytrace=False,
            )

    def _eval(self, expression: str) -> str:
        assert self.command is not None
        proc = subprocess.run(
            [*self.command, "eval", expression],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 0, f"rabbitmqctl eval exited {proc.returncode}: {proc.stderr}"
        return proc.stdout

    def shorten(self, timeout_ms: int) -> None:
        """Channels opened within ``WINDOW_MS`` from now time out after ``timeout_ms``;
        every channel's tick is ``TICK_MS`` until :meth:`restore`.

        The node's own values are kept under ``rabbit``'s ``SAVED`` the first time and
        restored from there: a shorten within another's window would otherwise take the
        short value for the node's own, and leave it (it did, once). The node's timers
        restore only while no later shorten came (``TOKEN``): an earlier test's would
        undo a later one's.
        """
        said = self._eval(
            f"Saved = case application:get_env(rabbit, {SAVED}) of "
            "{ok, S} -> S; "
            "undefined -> S0 = {application:get_env(rabbit, consumer_timeout), "
            "application:get_env(rabbit, channel_tick_interval)}, "
            f"application:set_env(rabbit, {SAVED}, S0), S0 end, "
            "{Timeout, Tick} = Saved, "
            "Token = erlang:unique_integer(), "
            f"application:set_env(rabbit, {TOKEN}, Token), "
            f"application:set_env(rabbit, consumer_timeout, {timeout_ms}), "
            f"application:set_env(rabbit, channel_tick_interval, {TICK_MS}), "
            f"spawn(fun() -> timer:sleep({WINDOW_MS}), "
            f"case application:get_env(rabbit, {TOKEN}) of "
            f"{{ok, Token}} -> {_restore('consumer_timeout', 'Timeout')}; _ -> ok end end), "
            f"spawn(fun() -> timer:sleep({SAFETY_MS}), "
            f"case application:get_env(rabbit, {TOKEN}) of "
            f"{{ok, Token}} -> {_restore('channel_tick_interval', 'Tick')}; _ -> ok end end), "
            'io:format("tick=~p timeout=~p~n", [Tick, Timeout]).'
        )
        value = r"(\{ok,\s*\d+\}|undefined)"
        found = re.search(rf"tick={value} timeout={value}", said)
        assert found, f"rabbitmqctl eval said {said!r}"
        self._tick, self._timeout = found[1].replace(" ", ""), found[2].replace(" ", "")

    def unshorten(self) -> None:
        """The timeout back now, for the channels opened from now on (before the node
        would, ``WINDOW_MS`` after :meth:`shorten`)."""
        if self._timeout is not None:
            self._eval(f"Timeout = {self._timeout}, {_restore('consumer_timeout', 'Timeout')}.")

    async def shorten_async(self, timeout_ms: int) -> None:
        await asyncio.to_thread(self.shorten, timeout_ms)

    def restore(self) -> None:
        """The node's own tick and timeout back, checked (the timeout is back already,
        unless the test ended within the window)."""
        if self._tick is None or self._timeout is None:
            return
        tick, timeout, self._tick = self._tick, self._timeout, None
        said = self._eval(
            f"Tick = {tick}, Timeout = {timeout}, "
            f"case application:get_env(rabbit, channel_tick_interval) of "
            f"{{ok, {TICK_MS}}} -> {_restore('channel_tick_interval', 'Tick')}; _ -> ok end, "
            f"{_restore('consumer_timeout', 'Timeout')}, "
            'io:format("now=~p ~p~n", [application:get_env(rabbit, channel_tick_interval), '
            "application:get_env(rabbit, consumer_timeout)]).",
        )
        assert f"now={tick} {timeout}" in said.replace(", ", ","), (
            f"the node's tick and consumer timeout are not back to {tick} {timeout}: {said!r}"
        )


class ShortTimeoutOnce(WorkerHook):
    """Before 4.3: the node-wide consumer timeout short while the worker's first channel
    opens (each channel reads it once), so only its first session times out.

    The timeout is back once that session ends, before the next one's hooks open their
    channels: the worker's journal tail, opened within the window, once timed out too
    (its catch-up is acked with the next record), and ended the second session."""

    def __init__(self, node: NodeTimeout, timeout_ms: int) -> None:
        self.node, self.timeout_ms, self.connects = node, timeout_ms, 0

    async def on_connect(self, connection: Any, lost: asyncio.Event) -> None:
        self.connects += 1  # the consuming channel opens right after the hooks
        if self.connects == 1:
            await self.node.shorten_async(self.timeout_ms)
        elif self.connects == 2:  # should the unshorten below have been cut short
            await asyncio.to_thread(self.node.unshorten)

    async def on_disconnect(self) -> None:
        if self.connects == 1:
            await asyncio.to_thread(self.node.unshorten)
