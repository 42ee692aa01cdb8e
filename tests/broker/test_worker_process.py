"""The ``rmqdelay worker`` process: SIGKILL loses nothing, SIGTERM drains, exit codes, logs.

The worker runs ``tests/helpers/worker_apps.py:app`` in a process of its own, configured by
``RMQDELAY_*``; its handlers write one line per event to a log file we poll.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pika
import pytest

from rmqdelay import Settings
from rmqdelay.amqp.publisher import Publisher
from tests.helpers.brokerctl import BrokerAdmin
from tests.helpers.cli import CLI, run_cli, settings_env
from tests.helpers.worker_helpers import TestTopology, work_queue

ROOT = Path(__file__).resolve().parents[2]  # the worker imports its app from its folder
APP = "tests.helpers.worker_apps:app"


def events(log: Path) -> list[tuple[str, str, int]]:
    """``(event, message_id, pid)`` of each complete line of the handlers' log."""
    if not log.exists():
        return []
    rows = []
    for line in log.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            rows.append((parts[0], parts[1], int(parts[3])))
    return rows


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, worker: WorkerProcess | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        exited = worker is not None and worker.proc.poll() is not None
        if exited or time.monotonic() > deadline:
            output = f"; the worker said:\n{worker.output}" if worker else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{output}")
        time.sleep(0.05)


class WorkerProcess:
    """``rmqdelay worker tests.helpers.worker_apps:app`` in a subprocess, its output in
    files."""

    def __init__(self, tmp: Path, env: dict[str, str], *args: str) -> None:
        self.stdout = tmp / f"worker-{time.monotonic_ns()}.out"
        self.stderr = self.stdout.with_suffix(".err")
        with self.stdout.open("wb") as out, self.stderr.open("wb") as err:
            self.proc = subprocess.Popen(
                [*CLI, "worker", APP, *args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )

    @property
    def output(self) -> str:
        return self.stdout.read_text() + self.stderr.read_text()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"worker did not exit within {timeout}s:\n{self.output}") from None

    def ensure_dead(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def procs() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for proc in started:
        proc.ensure_dead()


def worker_env(
    settings: Settings,
    log: Path,
    sleep: float,
    topology: TestTopology,
    url: str | None = None,
) -> dict[str, str]:
    extra = {
        "WORKER_TEST_LOG": str(log),
        "WORKER_TEST_SLEEP": str(sleep),
        "WORKER_TEST_BATCH": topology.dest("batch"),
        "WORKER_TEST_SLOW": topology.dest("slow"),
    }
    return settings_env(settings, url=url or settings.url.get_secret_value(), extra=extra)


def depth(settings: Settings, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(settings.url.get_secret_value()))
    try:
        ok = connection.channel().queue_declare(queue, passive=True)
        return int(ok.method.message_count or 0)
    finally:
        connection.close()


def publish(settings: Settings, destination: str, bodies: list[object]) -> list[str]:
    with Publisher(settings) as publisher:
        results = publisher.publish_many(
            {"destination": destination, "body": body, "delay": 0} for body in bodies
        )
    return [r.message_id for r in results]


def test_sigkill_mid_batch_loses_nothing(
    shared_topology: TestTopology, tmp_path: Path, procs: list[WorkerProcess]
) -> None:
    batch = shared_topology.dest("batch")
    settings = shared_topology.settings([batch])
    total = 200
    ids = publish(settings, batch, [{"n": i} for i in range(total)])
    log = tmp_path / "handled.log"
    env = worker_env(settings, log, sleep=0.02, topology=shared_topology)

    first = WorkerProcess(tmp_path, env, "-Q", batch, "--concurrency", "4", "--prefetch", "8")
    procs.append(first)
    wait_for(lambda: sum(e == "done" for e, _, _ in events(log)) >= 40, 30, "40 handled", first)
    first.proc.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    done_by_first = {m for e, m, _ in events(log) if e == "done"}
    assert len(done_by_first) < total, "the batch finished before the kill: make it longer"

    second = WorkerProcess(tmp_path, env, "-Q", batch, "--concurrency", "4", "--prefetch", "8")
    procs.append(second)
    wait_for(
        lambda: {m for e, m, _ in events(log) if e == "done"} >= set(ids),
        60,
        "every message handled after the restart",
        second,
    )
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait(20) == 0, second.output

    done = Counter(m for e, m, _ in events(log) if e == "done")
    started = Counter(m for e, m, _ in events(log) if e == "start")
    assert set(done) == set(ids)  # nothing lost
    duplicates = sum(done.values()) - total
    restarted = sum(started.values()) - total  # started again after the kill
    print(
        f"\nSIGKILL: first worker finished {len(done_by_first)} of {total}; "
        f"duplicates (handled twice) {duplicates}, handlers started twice {restarted}"
    )
    # Only what the killed worker had in hand can come twice: at most its prefetch.
    assert 0 <= duplicates <= 8
    assert depth(settings, work_queue(settings, batch)) == 0


def test_sigterm_finishes_in_flight_handlers_and_exits_0(
    shared_topology: TestTopology,
    amqp_url: str,
    prefix: str,
    tmp_path: Path,
    procs: list[WorkerProcess],
    admin: BrokerAdmin,
) -> None:
    """Also: a user with no configure permission can run the worker once the topology
    exists, and its password never shows in the logs."""
    batch = shared_topology.dest("batch")
    settings = shared_topology.settings([batch])
    user, password = f"{prefix}-worker", "Zq8-secret-pw-Zq8"
    admin.add_user(user, password, configure="^$", write=".*", read=".*")
    parts = urllib.parse.urlsplit(amqp_url)
    host = parts.netloc.rpartition("@")[2]
    limited_url = urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))

    ids = publish(settings, batch, [{"n": i} for i in range(6)])
    log = tmp_path / "handled.log"
    env = worker_env(settings, log, sleep=1.5, topology=shared_topology, url=limited_url)
    worker = WorkerProcess(tmp_path, env, "-Q", batch, "--concurrency", "3", "--prefetch", "6")
    procs.append(worker)
    wait_for(lambda: sum(e == "start" for e, _, _ in events(log)) >= 3, 30, "3 handlers", worker)
    worker.proc.send_signal(signal.SIGTERM)
    code = worker.wait(20)
    output = worker.output
    assert code == 0, output

    rows = events(log)
    started = [m for e, m, _ in rows if e == "start"]
    done = [m for e, m, _ in rows if e == "done"]
    assert len(started) == 3 and sorted(done) == sorted(started), rows
    # The three in flight were acked; the three prefetched but not started went back.
    assert depth(settings, work_queue(settings, batch)) == 3
    assert set(ids) - set(done)  # still there for the next worker

    assert password not in output
    assert "outcome=acked" in output and f"message_id={done[0]}" in output
    assert f"destination={batch}" in output and "attempt=1" in output and "lateness_ms=" in output


FREEZE_SCRIPT = """
import asyncio, gc, sys, time
from rmqdelay import Settings, Worker

async def handle(body, ctx):
    pass

async def main():
    settings = Settings()
    worker = Worker(settings)
    worker.add_handler(sys.argv[1], handle)
    runner = worker.runner(settings)

    async def stop_once_frozen():
        deadline = time.monotonic() + 20
        while gc.get_freeze_count() == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        runner.stop()

    before = gc.get_freeze_count()
    stopper = asyncio.create_task(stop_once_frozen())
    code = await runner.run_until_signalled()
    await stopper
    print(before, gc.get_freeze_count(), code, runner.connects)

asyncio.run(main())
"""


def test_a_worker_process_freezes_its_start_up_heap_once_consuming(
    shared_topology: TestTopology,
) -> None:
    """``run_until_signalled`` (``Worker.run``, ``rmqdelay worker``, ``bridge run``)
    leaves the start-up heap out of later collections (see ``rmqdelay.worker.heap``)."""
    destination = shared_topology.dest("batch")
    env = settings_env(shared_topology.settings([destination]))
    done = subprocess.run(
        [sys.executable, "-c", FREEZE_SCRIPT, destination],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    before, after, code, connects = map(int, done.stdout.split())
    assert (before, code, connects) == (0, 0, 1), done.stdout + done.stderr
    assert after > 1000, done.stdout  # the imports' objects, at least


def test_second_signal_stops_at_once_and_returns_the_messages(
    shared_topology: TestTopology, tmp_path: Path, procs: list[WorkerProcess]
) -> None:
    slow = shared_topology.dest("slow")
    settings = shared_topology.settings([slow])
    publish(settings, slow, ["a", "b"])
    log = tmp_path / "handled.log"
    env = worker_env(settings, log, sleep=60, topology=shared_topology)
    worker = WorkerProcess(tmp_path, env, "-Q", slow, "--concurrency", "2")
    procs.append(worker)
    wait_for(lambda: sum(e == "start" for e, _, _ in events(log)) >= 2, 30, "2 handlers", worker)
    worker.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # the first signal is being handled: it waits for the handlers
    assert worker.proc.poll() is None
    stopped_at = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    code = worker.wait(10)
    assert time.monotonic() - stopped_at < 5
    assert code == 128 + signal.SIGTERM, worker.output
    assert not [e for e, _, _ in events(log) if e == "done"]
    wait_for(lambda: depth(settings, work_queue(settings, slow)) == 2, 10, "both messages back")


def test_cli_errors_name_the_thing_to_fix(
    shared_topology: TestTopology, tmp_path: Path, procs: list[WorkerProcess]
) -> None:
    slow = shared_topology.dest("slow")
    settings = shared_topology.settings([shared_topology.dest("batch")])  # no "slow" queue
    env = worker_env(settings, tmp_path / "log", sleep=0, topology=shared_topology)

    def run(*args: str) -> tuple[int, str]:
        proc = run_cli(env, "worker", *args, cwd=ROOT)
        return proc.returncode, " ".join((proc.stdout + proc.stderr).split())

    code, text = run("no_such_module:app")
    assert code == 1 and "cannot import module 'no_such_module'" in text
    code, text = run(APP)  # the "slow" work queue does not exist
    assert code == 1
    assert f"work queue '{settings.prefix}.work.{slow}'" in text
    assert f"rmqdelay topology apply --destination {slow}" in text


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _held_gauge(port: int, dest: str) -> float:
    """The worker's ``rmqdelay_held_messages`` for ``dest`` (0 while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
            text = answer.read().decode()
    except OSError:
        return 0.0
    sample = f'rmqdelay_held_messages{{destination="{dest}"}} '
    for line in text.splitlines():
        if line.startswith(sample):
            return float(line[len(sample) :])
    return 0.0


def test_sigkill_while_holding_loses_nothing_and_hands_nothing_over_early(
    shared_topology: TestTopology, tmp_path: Path, procs: list[WorkerProcess]
) -> None:
    """A held destination (its topology marked; the worker finds the marker itself):
    the first worker holds every message when it is killed; the broker gives them back,
    and the next worker waits out what remains of each."""
    held = shared_topology.dest("held")
    settings = shared_topology.settings([held], held_destinations=[held])
    log = tmp_path / "handled.log"
    env = {**worker_env(settings, log, sleep=0, topology=shared_topology)}
    env["WORKER_TEST_HELD"] = held
    port = _free_port()
    first = WorkerProcess(tmp_path, env, "-Q", held, "--metrics-port", str(port))
    procs.append(first)
    wait_for(lambda: "consuming" in first.output, 30, "the first worker consuming", first)
    total = 40
    with Publisher(settings) as publisher:
        results = publisher.publish_many(
            {"destination": held, "body": {"n": i}, "delay": 2.0 + i * 0.01} for i in range(total)
        )
    wait_for(lambda: _held_gauge(port, held) == total, 10, f"{total} held", first)
    first.proc.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    second = WorkerProcess(tmp_path, env, "-Q", held)
    procs.append(second)
    wait_for(lambda: "consuming" in second.output, 30, "the next worker consuming", second)
    up_ms = time.time_ns() // 1_000_000  # the restart took until here (at most)

    def handled() -> dict[str, tuple[int, int]]:
        rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
        return {r[1]: (int(r[2]), int(r[3])) for r in rows if len(r) == 5 and r[0] == "held"}

    wait_for(lambda: len(handled()) == total, 30, "every message handled", second)
    second.proc.send_signal(signal.SIGTERM)
    assert second.wait(20) == 0, second.output
    rows = [line.split() for line in log.read_text().splitlines()]
    assert len(rows) == total, "a message was handled twice"
    seen = handled()
    for result in results:
        due_ms, at_ms = seen[result.message_id]
        assert due_ms == result.due_at_ms
        assert at_ms >= due_ms, f"handled {due_ms - at_ms} ms early"
        # late by at most the restart, for those due before the next worker came
        assert at_ms - max(due_ms, up_ms) <= 10_000
    assert depth(settings, work_queue(settings, held)) == 0
