"""docs/migration.md's steps that involve rmqdelay, run in order as the guide writes them.

The guide's ``sh`` blocks run as commands (``rmqdelay bridge run`` in the background, as a
supervisor would), its ``python`` blocks as scripts, with the test broker's URL and names
of the test's own (``orders`` becomes ``{prefix}.orders``). The plugin is not packaged
here, so its exchange is played by a plain direct ``orders`` with the consumer's queue
bound, as a plugin user's would be; what the guide says of the plugin itself is not run.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pika.exceptions
import pytest

from tests.helpers.cli import CLI, rmqdelay_env, run_cli
from tests.helpers.readme_blocks import commands

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
GUIDE_URL = "amqp://guest:guest@localhost:5672/%2F"
DELAY_MS = 3000  # the publisher block's x-delay


def guide_blocks(prefix: str, url: str) -> list[tuple[str, str]]:
    """The guide's sh and python blocks in order, on the test's broker and names."""
    text = GUIDE.read_text(encoding="utf-8")
    text = text.replace("bridge.orders.bridge", f"bridge.{prefix}.orders.bridge")
    text = re.sub(r"(?<=[\s\"'])orders(?=[\s\"'.])", f"{prefix}.orders", text)
    text = re.sub(r"(?<=[\s\"'])order-emails(?=[\"'])", f"{prefix}.order-emails", text)
    text = text.replace(GUIDE_URL, url)
    return re.findall(r"```(sh|python)\n(.*?)```", text, flags=re.S)


class Steps:
    """Runs the guide's blocks; keeps the background processes to stop them."""

    def __init__(self, env: dict[str, str], tmp_path: Path) -> None:
        self.env = env
        self.tmp_path = tmp_path
        self.background: list[tuple[subprocess.Popen[bytes], Path]] = []

    def sh(self, block: str) -> list[subprocess.CompletedProcess[str]]:
        done = []
        for command in commands(block):
            if command.startswith("export RMQDELAY_URL="):
                continue  # the test broker's URL is in the environment already
            assert command.startswith("rmqdelay "), command
            args = command.split()[1:]
            if args[:2] == ["bridge", "run"]:
                log = self.tmp_path / f"bridge-{len(self.background)}.log"
                with log.open("w") as out:  # a file: a pipe nobody reads could fill up
                    process = subprocess.Popen(
                        [*CLI, *args], env=self.env, stdout=out, stderr=subprocess.STDOUT
                    )
                self.background.append((process, log))
                continue
            result = run_cli(self.env, *args)
            assert result.returncode == 0, (command, result.stdout[-1500:], result.stderr[-1500:])
            done.append(result)
        return done

    def python(self, block: str) -> None:
        script = self.tmp_path / "step.py"
        script.write_text(block)
        result = subprocess.run(
            [sys.executable, str(script)], env=self.env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr[-2000:]

    def stop(self) -> None:
        """SIGTERM, as a supervisor stops a bridge: each must exit 0."""
        for process, _log in self.background:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, log in self.background:
            try:
                process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            assert process.returncode == 0, log.read_text()[-1500:]


def take(channel: Any, queue: str, timeout: float) -> tuple[float, Any, Any, bytes]:
    """The next message of ``queue`` (acked), with its arrival time; polled to a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is not None:
            return time.time(), method, properties, body
        assert time.monotonic() < deadline, f"nothing reached {queue} in {timeout}s"
        time.sleep(0.05)


def scheduled(env: dict[str, str], destination: str) -> list[str]:
    result = run_cli(env, "scheduled", "list", "--destination", destination, "--json")
    assert result.returncode == 0, result.stderr[-1500:]
    return [line for line in result.stdout.splitlines() if line.strip()]


@pytest.fixture
def steps(amqp_url: str, prefix: str, tmp_path: Path) -> Iterator[Steps]:
    # a one-hour maximum keeps the test's topology small on a shared broker
    env = rmqdelay_env(amqp_url, prefix, max_delay="1h")
    found = Steps(env, tmp_path)
    try:
        yield found
    finally:
        for process, _log in found.background:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_the_migration_guide_runs_in_order(steps: Steps, amqp_url: str, prefix: str) -> None:
    blocks = guide_blocks(prefix, str(amqp_url))
    assert [kind for kind, _ in blocks] == ["sh", "sh", "python", "python", "python", "sh"]
    (_, declare), (_, run), (_, bind), (_, publish), (_, drain), (_, upgraded) = blocks
    orders, dname = f"{prefix}.orders", f"{prefix}.orders.delayed"
    queue, destination = f"{prefix}.order-emails", f"bridge.{prefix}.orders.bridge"

    connection = pika.BlockingConnection(pika.URLParameters(str(amqp_url)))
    channel = connection.channel()
    # before: the plugin's exchange (played by a plain one) and a consumer's queue on it
    channel.exchange_declare(orders, "direct", durable=True)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, orders, "order.created")

    # 1. declare the bridge under a new name; it says where consumers bind
    (declared,) = steps.sh(declare)
    assert f"bind consumers' queues to {dname!r}" in declared.stdout
    assert "warning" not in declared.stderr
    # 2. run it; 3. bind the consumer's queue to the delivery exchange
    steps.sh(run)
    steps.python(bind)
    # 4. the publisher, moved: published at `sent` or later, due DELAY_MS after
    sent = time.time()
    steps.python(publish)
    # the bridge records it in the schedule journal (it may still be starting: poll)
    deadline = time.monotonic() + 20
    while len(scheduled(steps.env, destination)) != 1:
        assert time.monotonic() < deadline, "the bridged message is not in scheduled list"
    arrived, method, properties, body = take(channel, queue, 30)
    assert arrived >= sent + DELAY_MS / 1000, "delivered early"
    assert arrived - sent < DELAY_MS / 1000 + 10  # a sanity bound; bench/ measures lateness
    assert (method.exchange, method.routing_key, body) == (
        dname,
        "order.created",
        b'{"order_id": 42}',
    )
    assert "x-delay" not in (properties.headers or {})
    assert properties.delivery_mode == 2
    assert scheduled(steps.env, destination) == []  # step 6's drain check of a bridge

    # a publisher still declaring the plugin's type fails, as the guide says
    with pytest.raises(pika.exceptions.AMQPError) as refused:
        connection.channel().exchange_declare(
            orders, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"}
        )
    assert "unknown exchange type 'x-delayed-message'" in str(refused.value)
    if connection.is_open:
        connection.close()  # 3.x closes the whole connection (503), 4.3 the channel (406)

    # 5. the old exchange has drained: its binding and itself go
    steps.python(drain)
    check = pika.BlockingConnection(pika.URLParameters(str(amqp_url)))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        check.channel().exchange_declare(orders, passive=True)

    # 6. after the upgrade: passive checks, and declare again, which changes nothing
    _verified, again = steps.sh(upgraded)
    assert "warning" not in again.stderr

    # ... and the name taken back: a bridge for `orders`, the same delivery exchange
    steps.sh(declare.replace(f"{orders}.bridge", orders))
    steps.sh(run.replace(f"{orders}.bridge", orders))
    channel = check.channel()
    channel.confirm_delivery()
    channel.exchange_declare(orders, "direct", durable=True)  # a plain declare works now
    sent = time.time()
    headers: dict[str, Any] = {"x-delay": 1000, "tenant": "acme"}
    channel.basic_publish(
        orders, "order.created", b"back", pika.BasicProperties(headers=headers), mandatory=True
    )
    arrived, method, properties, body = take(channel, queue, 30)
    assert arrived >= sent + 1.0, "delivered early"
    assert (method.exchange, body, properties.headers) == (dname, b"back", {"tenant": "acme"})
    check.close()
    steps.stop()
