"""Every reader of the schedule journal against what happened before: ``python -m bench.history``.

    python -m bench.history                      # history 0, 1M, 10M x pending 0, 1M
    python -m bench.history --quick              # history 0, 100k x pending 0, 20k
    python -m bench.history --history 0,1000000 --pending 0 --repeats 5

A grid of cells, each on a fresh prefix (``max_delay`` and ``journal_retention`` at their
defaults: 366 days, 2 GiB): ``history`` records of messages delivered before, then
``pending`` records of messages due in the next 1 to 24 hours.

**The fill** is what a service's journal holds after months: the history's records are
``scheduled`` records due between 30 days and an hour ago, the pending ones due ahead,
written raw as ``docs/protocol.md`` (section 6) says, 500 to a stream message, confirmed.
The messages themselves are not in the tiers: every timed command reads the journal, not
the tiers, and a million real messages in quorum tiers is :mod:`bench.scale`'s subject.
While it fills, checkpoints are written as a running worker writes them: once the tail
since the last outgrows an eighth of it, or 1 MiB (``rmqdelay scheduled checkpoint``, in
this process); the tail after the last one is what it is when the fill ends.

**Each round** runs every operation in a fresh process (:mod:`bench.history_probe`: the
bytes it read from the broker and its peak RSS), in turn:

- ``worker``: ``rmqdelay worker bench.history_app:app`` with one message due already in
  its work queue: from the process's start to that message handled;
- ``list``: ``rmqdelay scheduled list --limit 50``;
- ``cancel``: ``rmqdelay cancel ID``, a pending message (one published for it, with
  nothing pending);
- ``keyed``: ``rmqdelay publish DEST BODY --delay 1h --key K --on-conflict ignore``, a key
  of its own;
- ``dashboard``: ``rmqdelay dashboard`` on a fresh state file: from its start to the
  first 200 of ``GET /api/scheduled?limit=50``; its peak RSS then;
- ``restart``: that dashboard stopped, 1,000 records written, and started again on its
  state file: to its first page again.

Prints each cell's medians with their ratio to the same operation at no history (same
pending), and the journal's and the checkpoint stream's bytes on disk when the broker's
data directory is on this machine. Writes ``bench/results/history.json``. Each cell's
topology is deleted after it.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika

from bench.common import DEFAULT_AMQP_URL, machine_load, now_ms
from bench.scheduled_list import write_results
from rmqdelay import Publisher, Settings, TopologyManager
from rmqdelay.core.journal.checkpoint import MIN_TAIL_BYTES, TAIL_RATIO

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "history.json"
DESTINATION = "history"
OPERATIONS = ("worker", "list", "cancel", "keyed", "dashboard", "restart")
PER_MESSAGE = 500
"""Records to a journal write, as rmqdelay writes them."""
RESTART_TAIL = 1000
DAY_MS = 86_400_000
WAIT_S = 600.0
"""The longest any one operation may take before the bench gives up on it."""


def label(count: int) -> str:
    if count == 0:
        return "0"
    if count % 1_000_000 == 0:
        return f"{count // 1_000_000}m"
    return f"{count // 1000}k"


@dataclass
class Cell:
    history: int
    pending: int
    settings: Settings
    env: dict[str, str]
    checkpoints: int = 0
    fill_s: float = 0.0
    runs: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"h{label(self.history)}_p{label(self.pending)}"


# ------------------------------------------------------------------ the fill


class Filler:
    """Raw journal writes, confirmed, with a checkpoint whenever one is due."""

    def __init__(self, cell: Cell) -> None:
        self.cell = cell
        self.url = cell.settings.url.get_secret_value()
        self.connection = pika.BlockingConnection(pika.URLParameters(self.url))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()
        self.exchange = f"{cell.settings.prefix}.schedule"
        self.tail = 0
        self.last = 0

    def records(self, lines: list[str]) -> None:
        for start in range(0, len(lines), PER_MESSAGE):
            body = "\n".join(lines[start : start + PER_MESSAGE]).encode()
            properties = pika.BasicProperties(
                delivery_mode=2,
                message_id=f"journal-{uuid.uuid4()}",
                content_type="application/json",
                type="rmqdelay-journal",
            )
            self.channel.basic_publish(self.exchange, "", body, properties, mandatory=True)
            self.tail += len(body)
            if self.tail > max(MIN_TAIL_BYTES, self.last // TAIL_RATIO):
                self.checkpoint()

    def checkpoint(self) -> None:
        said = cli("scheduled", "checkpoint", "--json", *self.cell_options())
        self.last = sum(parts_entries_bytes[2] for parts_entries_bytes in said["sections"].values())
        self.tail = 0
        self.cell.checkpoints += 1

    def cell_options(self) -> list[str]:
        return ["--url", self.url, "--prefix", self.cell.settings.prefix]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.connection.close()


def cli(*argv: str) -> Any:
    """``rmqdelay ARGV --json`` in this process (its command line, not its internals)."""
    from rmqdelay.cli.app import app

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        app.main(args=list(argv), prog_name="rmqdelay", standalone_mode=False)
    return json.loads(out.getvalue())


def record(kind_id: str, due: int, recorded: int) -> str:
    return (
        f'{{"v":1,"k":"scheduled","id":"{kind_id}","d":"{DESTINATION}","due":{due},'
        f'"a":1,"n":100,"t":{recorded}}}'
    )


def history_lines(start: int, count: int, total: int, now: int) -> list[str]:
    """Records of messages due between 30 days and an hour ago, in due order."""
    span = 30 * DAY_MS - 3_600_000
    out = []
    for n in range(start, start + count):
        due = now - 30 * DAY_MS + span * n // max(total, 1)
        out.append(record(f"h{n}", due, due - DAY_MS))
    return out


def fill(cell: Cell) -> None:
    started = time.perf_counter()
    filler = Filler(cell)
    try:
        now = now_ms()
        for start in range(0, cell.history, 100_000):
            count = min(100_000, cell.history - start)
            filler.records(history_lines(start, count, cell.history, now))
        now = now_ms()
        for start in range(0, cell.pending, 100_000):
            count = min(100_000, cell.pending - start)
            lines = [
                record(f"p{n}", now + 3_600_000 + (n * 7919 % 82_800) * 1000, now)
                for n in range(start, start + count)
            ]
            filler.records(lines)
    finally:
        filler.close()
    cell.fill_s = time.perf_counter() - started


def tail(cell: Cell, count: int) -> None:
    """``count`` records more, after the fill (what a restarted dashboard reads)."""
    filler = Filler(cell)
    filler.last = 2**62  # no checkpoint: this is the tail
    try:
        now = now_ms()
        filler.records(history_lines(0, count, count, now))
    finally:
        filler.close()


# ------------------------------------------------------------------ the operations


def probe(cell: Cell, *argv: str) -> tuple[subprocess.Popen[bytes], Path]:
    """Start ``rmqdelay ARGV`` in a fresh process through :mod:`bench.history_probe`."""
    report = Path(tempfile.mkstemp(prefix="bench-history-", suffix=".json")[1])
    report.unlink()
    env = {**cell.env, "BENCH_PROBE": str(report)}
    command = [sys.executable, "-m", "bench.history_probe", *argv]
    process = subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    return process, report


def finish(process: subprocess.Popen[bytes], report: Path, what: str) -> dict[str, Any]:
    try:
        _out, err = process.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        raise SystemExit(f"history: {what} did not end within {WAIT_S:g} s") from None
    if process.returncode not in (0, -15):
        text = err.decode(errors="replace")[-800:]
        raise SystemExit(f"history: {what} exited {process.returncode}: {text}")
    said: dict[str, Any] = json.loads(report.read_text(encoding="utf-8"))
    report.unlink()
    return said


def timed(cell: Cell, *argv: str) -> dict[str, float]:
    started = time.time()
    process, report = probe(cell, *argv)
    said = finish(process, report, " ".join(argv[:2]))
    return {"s": time.time() - started, "read": said["read_bytes"], "rss": said["peak_rss_kb"]}


def worker(cell: Cell) -> dict[str, float]:
    with Publisher(cell.settings) as publisher:
        sent = publisher.publish(DESTINATION, b"now", delay=0).message_id
    started = time.time()
    process, report = probe(
        cell, "worker", "bench.history_app:app", "-Q", DESTINATION, "--log-level", "WARNING"
    )
    said = finish(process, report, "the worker")
    if said.get("message_id") != sent:
        raise SystemExit(f"history: the worker handled {said.get('message_id')}, not {sent}")
    return {
        "s": said["handled_at"] - started,
        "read": said["read_bytes"],
        "rss": said["peak_rss_kb"],
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def dashboard(cell: Cell, state: Path, fresh: bool) -> dict[str, float]:
    """A dashboard started on ``state``: seconds to its first page, read, peak RSS."""
    if fresh:
        for path in glob.glob(f"{state}*"):
            os.unlink(path)
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/scheduled?limit=50"
    started = time.time()
    process, report = probe(cell, "dashboard", "--port", str(port), "--state", str(state))
    try:
        while True:
            if process.poll() is not None:
                raise SystemExit(f"history: the dashboard ended: {process.stderr.read()[-800:]!r}")  # type: ignore[union-attr]
            try:
                with urllib.request.urlopen(url, timeout=WAIT_S) as answer:
                    page = json.loads(answer.read())
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass  # not listening yet, or 503 while it reads
            if time.time() - started > WAIT_S:
                raise SystemExit("history: the dashboard gave no page")
            time.sleep(0.05)
        first = time.time() - started
        expected = min(50, cell.pending)
        if len(page["rows"]) < expected:
            raise SystemExit(f"history: the dashboard's page had {len(page['rows'])} rows")
        # ready: a page only the store answers (newest first), not the first page
        while not _answers(url + "&order=newest"):
            if time.time() - started > WAIT_S:
                raise SystemExit("history: the dashboard's store was never ready")
            time.sleep(0.05)
        ready = time.time() - started
        rss = _vm_hwm(process.pid)
    finally:
        process.terminate()
    said = finish(process, report, "the dashboard")
    return {"s": first, "ready": ready, "read": said["read_bytes"], "rss": rss}


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=WAIT_S) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _vm_hwm(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def one_round(cell: Cell, number: int, state: Path) -> None:
    runs = cell.runs
    runs.setdefault("worker", []).append(worker(cell))
    runs.setdefault("list", []).append(timed(cell, "scheduled", "list", "--limit", "50"))
    if cell.pending:
        target = f"p{(number * 104_729) % cell.pending}"
    else:
        with Publisher(cell.settings) as publisher:
            target = publisher.publish(DESTINATION, b"c", delay="1h").message_id
    runs.setdefault("cancel", []).append(timed(cell, "cancel", target))
    key = f"key-{number}-{uuid.uuid4().hex[:6]}"
    keyed = ["publish", DESTINATION, "k", "--delay", "1h", "--key", key, "--on-conflict", "ignore"]
    runs.setdefault("keyed", []).append(timed(cell, *keyed))
    runs.setdefault("dashboard", []).append(dashboard(cell, state, fresh=True))
    tail(cell, RESTART_TAIL)
    runs.setdefault("restart", []).append(dashboard(cell, state, fresh=False))


# ------------------------------------------------------------------ the grid


def stream_disk(prefix: str) -> dict[str, int | None]:
    """Bytes on disk of the journal's and the checkpoint stream's segments, when the
    broker's data directory is here (RabbitMQ names a stream's ``__{name}_{stamp}``)."""
    roots = [
        "/var/lib/rabbitmq/mnesia/*/stream",
        str(Path.home() / ".cache/rmqdelay/*/var/lib/rabbitmq/mnesia/*/stream"),
    ]
    name = prefix.replace(".", "_")
    out: dict[str, int | None] = {"journal": None, "checkpoints": None}
    for root in roots:
        for directory in glob.glob(f"{root}/__{name}_schedule_*"):
            kind = "checkpoints" if "_schedule_checkpoints_" in directory else "journal"
            size = sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
            out[kind] = (out[kind] or 0) + size
    return out


def run_cell(url: str, history: int, pending: int, repeats: int) -> dict[str, Any]:
    settings = Settings(url=url, prefix=f"bench-history-{uuid.uuid4().hex[:6]}")
    env = {**os.environ, "RMQDELAY_URL": url, "RMQDELAY_PREFIX": settings.prefix}
    env["BENCH_HISTORY_DESTINATION"] = DESTINATION
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    cell = Cell(history, pending, settings, env)
    with TopologyManager(settings) as manager:
        manager.apply([DESTINATION])
    try:
        fill(cell)
        print(
            f"history: {cell.name} filled in {cell.fill_s:.0f} s, "
            f"{cell.checkpoints} checkpoints written",
            file=sys.stderr,
        )
        disk = stream_disk(settings.prefix)
        with tempfile.TemporaryDirectory() as directory:
            state = Path(directory) / "dashboard.sqlite3"
            for number in range(repeats):
                one_round(cell, number, state)
    finally:
        with TopologyManager(settings) as manager:
            manager.destroy(force=True)
    return {
        "history": history,
        "pending": pending,
        "fill_s": round(cell.fill_s, 1),
        "checkpoints": cell.checkpoints,
        "disk_bytes": disk,
        "operations": {
            name: {
                "median_s": round(statistics.median(r["s"] for r in rows), 3),
                "runs_s": [round(r["s"], 3) for r in rows],
                "read_bytes": int(statistics.median(r["read"] for r in rows)),
                "peak_rss_mib": round(max(r["rss"] for r in rows) / 1024, 1),
                **(
                    {"ready_s": round(statistics.median(r["ready"] for r in rows), 3)}
                    if "ready" in rows[0]
                    else {}
                ),
            }
            for name, rows in cell.runs.items()
        },
    }


def ratios(cells: dict[str, dict[str, Any]]) -> None:
    """Each operation's ratio to the same at no history (same pending)."""
    for cell in cells.values():
        base = next(
            (c for c in cells.values() if c["history"] == 0 and c["pending"] == cell["pending"]),
            None,
        )
        for name, row in cell["operations"].items():
            if base is not None:
                row["ratio_to_no_history"] = round(
                    row["median_s"] / base["operations"][name]["median_s"], 2
                )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.history", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--url", default=DEFAULT_AMQP_URL)
    parser.add_argument("--history", default="0,1000000,10000000", help="comma list")
    parser.add_argument("--pending", default="0,1000000", help="comma list")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--quick", action="store_true", help="history 0,100k; pending 0,20k; 2 rounds"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.history, args.pending, args.repeats = "0,100000", "0,20000", 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    histories = [int(v) for v in args.history.split(",")]
    pendings = [int(v) for v in args.pending.split(",")]
    load_before = machine_load(2.0)
    cells: dict[str, dict[str, Any]] = {}
    for pending in pendings:
        for history in histories:
            result = run_cell(args.url, history, pending, args.repeats)
            cells[f"h{label(history)}_p{label(pending)}"] = result
    ratios(cells)
    print(f"\nmedians of {args.repeats} rounds (x: to the same with no history):")
    for name, cell in cells.items():
        print(f"  {name}: journal on disk {cell['disk_bytes']}")
        for op, row in cell["operations"].items():
            ratio = row.get("ratio_to_no_history", 1)
            read, rss = row["read_bytes"] / 1e6, row["peak_rss_mib"]
            ready = f"  ready {row['ready_s']:.2f} s" if "ready_s" in row else ""
            print(
                f"    {op:<10} {row['median_s']:>8.3f} s  x{ratio:>5.2f}"
                f"  read {read:>8.1f} MB  peak RSS {rss:>6.0f} MiB{ready}"
            )
    write_results(
        "history",
        ["python", "-m", "bench.history", *(argv or [])],
        args.url,
        args.out,
        load_before,
        {"history": histories, "pending": pendings, "repeats": args.repeats},
        cells,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
