"""A Redis sorted set with a polling consumer (the common "delay queue on Redis" design).

The peer starts its *own* ``redis-server`` (``/usr/bin/redis-server`` unless
``BENCH_REDIS_SERVER`` says otherwise) bound to 127.0.0.1 on a free port, with its data in a
fresh temp dir; it never touches a system Redis on 6379. Persistence modes:

* ``off``      — ``--save "" --appendonly no``: memory only.
* ``everysec`` — ``--appendonly yes --appendfsync everysec`` (RDB snapshots off).
* ``always``   — ``--appendonly yes --appendfsync always`` (fsync before replying).

Producer: ``ZADD key <due_ms> "<id>|<published_ms>|<due_ms>"``, pipelined in chunks; the
command reply is the acknowledgement. Consumer: every ``poll_ms`` one Lua script atomically
takes up to ``batch`` members with score <= now and removes them (ZRANGEBYSCORE + ZREM in
one script); a popped member counts as delivered. Note the design's weak spot: a consumer
that dies between the pop and its processing loses the message (no ack/redelivery).

``kill9_loss(mode, n)`` measures what survives a ``kill -9`` of redis-server right after the
last acknowledged write, restarting it from the same dir. ``kill -9`` kills the process,
not the machine: data already ``write()``-n to the AOF is in the OS page cache and survives,
so this measures process-crash loss, not power-loss loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Collection, Sequence
from typing import Any

import redis
import redis.asyncio as aredis

from bench.common import Record, now_ms
from bench.peers.base import Arrivals, Item, unique_prefix

REDIS_SERVER = os.environ.get("BENCH_REDIS_SERVER", "/usr/bin/redis-server")
MODES: dict[str, list[str]] = {
    "off": ["--save", "", "--appendonly", "no"],
    "everysec": ["--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
    "always": ["--save", "", "--appendonly", "yes", "--appendfsync", "always"],
}

POP_DUE_LUA = """
local items = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
if #items > 0 then
  redis.call('ZREM', KEYS[1], unpack(items))
end
return items
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """PR_SET_PDEATHSIG: the redis child gets SIGKILL if this Python process dies."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


class RedisServer:
    """One private redis-server process on loopback, in its own temp dir."""

    def __init__(self, mode: str, tag: str = "redis") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {tuple(MODES)}")
        self.mode = mode
        self.tag = tag
        self.dir = ""  # created by the first start(); restarts reuse it
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            REDIS_SERVER,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--dir", self.dir,
            "--logfile", os.path.join(self.dir, "redis.log"),
            *MODES[self.mode],
        ]  # fmt: skip

    def start(self, timeout: float = 15.0) -> None:
        if not self.dir:
            self.dir = tempfile.mkdtemp(prefix=f"{self.tag}-")
        self.proc = subprocess.Popen(
            self.argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1.0)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
                try:
                    if client.ping():
                        return
                except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("redis-server did not become ready")
                time.sleep(0.02)
        finally:
            client.close()

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill9()

    def cleanup(self) -> None:
        """Stop the process (if any) and remove the temp dir. Never raises."""
        with contextlib.suppress(Exception):
            self.stop()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


class RedisZsetPeer:
    """Sorted-set delay queue with a polling consumer; one private redis-server per peer."""

    supports_delay = True

    def __init__(
        self,
        mode: str = "off",
        *,
        poll_ms: int = 10,
        batch: int = 1000,
        chunk: int = 200,
        body_bytes: int = 100,
    ) -> None:
        self.mode = mode
        self.poll_ms = poll_ms
        self.batch = batch
        self.chunk = chunk
        self.body_pad = "x" * body_bytes
        self.prefix = unique_prefix(f"redis-{mode}")
        self.key = f"{self.prefix}:delayed"
        self.name = f"redis-zset-{mode}"
        self.description = (
            f"Redis {_redis_version()} sorted set, private redis-server on loopback "
            f"(persistence {mode}: {' '.join(a or repr(a) for a in MODES[mode])}). Producer: "
            f"pipelined ZADD (chunks of {chunk}, reply = ack), score = due ms. Consumer: one "
            f"Lua script every {poll_ms} ms atomically pops up to {batch} due members "
            f"(ZRANGEBYSCORE+ZREM); pop = delivery (no ack, no redelivery). redis-py asyncio."
        )
        self.arrivals = Arrivals()
        self.server = RedisServer(mode, tag=self.prefix)
        self._client: aredis.Redis | None = None
        self._poller: asyncio.Task[None] | None = None
        self._torn_down = False
        self._stopping = False

    async def setup(self) -> None:
        try:
            await asyncio.to_thread(self.server.start)
            self._client = aredis.Redis(host="127.0.0.1", port=self.server.port)
            self._pop = self._client.register_script(POP_DUE_LUA)
            await self._client.ping()
            self._poller = asyncio.create_task(self._poll_loop())
        except BaseException:
            await self.teardown()
            raise

    async def _poll_loop(self) -> None:
        assert self._client is not None
        while not self._stopping:
            items = await self._pop(keys=[self.key], args=[now_ms(), self.batch])
            received = now_ms()
            for raw in items:
                mid, pub, due, _pad = raw.decode().split("|", 3)
                self.arrivals.add(Record(mid, int(due), received, int(pub)))
            if len(items) < self.batch:
                await asyncio.sleep(self.poll_ms / 1000)

    def cpu_pids(self) -> dict[str, int]:
        """The private redis-server, for CPU accounting."""
        proc = self.server.proc
        return {"redis": proc.pid} if proc is not None else {}

    async def publish(self, batch: Sequence[Item]) -> None:
        assert self._client is not None, "setup() first"
        for start in range(0, len(batch), self.chunk):
            pipe = self._client.pipeline(transaction=False)
            for mid, delay_ms in batch[start : start + self.chunk]:
                pub = now_ms()
                due = pub + delay_ms
                pipe.zadd(self.key, {f"{mid}|{pub}|{due}|{self.body_pad}": due})
            await pipe.execute()

    async def drain(self, expected_ids: Collection[str], timeout: float) -> list[Record]:
        records = await self.arrivals.wait_for(expected_ids, timeout)
        if self._poller is not None and self._poller.done() and not self._poller.cancelled():
            exc = self._poller.exception()
            if exc is not None:
                raise RuntimeError("redis poller died") from exc
        return records

    async def teardown(self) -> None:
        if self._torn_down:
            return
        self._torn_down = True
        self._stopping = True
        if self._poller is not None:
            # Let the loop see the flag (redis-py can swallow a cancel mid-command), then cancel.
            await asyncio.wait({self._poller}, timeout=1)
            if not self._poller.done():
                self._poller.cancel()
                await asyncio.wait({self._poller}, timeout=5)
            if self._poller.done() and not self._poller.cancelled():
                self._poller.exception()  # retrieved: a late error after stop is irrelevant
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.aclose()
        await asyncio.to_thread(self.server.cleanup)


async def kill9_loss(mode: str, n: int = 10_000, *, chunk: int = 200) -> dict[str, Any]:
    """Write ``n`` future-due items, ``kill -9`` redis right after the last ack, restart it
    from the same dir and count the survivors. Returns written/survived/lost and timings."""
    server = RedisServer(mode, tag=unique_prefix(f"redis-kill9-{mode}"))
    key = "delayed"
    try:
        await asyncio.to_thread(server.start)
        client = aredis.Redis(host="127.0.0.1", port=server.port)
        due = now_ms() + 3_600_000
        t0 = time.perf_counter()
        try:
            for start in range(0, n, chunk):
                pipe = client.pipeline(transaction=False)
                for i in range(start, min(n, start + chunk)):
                    pipe.zadd(key, {f"k{i}": due})
                await pipe.execute()
            # Last reply received: kill now, with no await in between.
            server.kill9()
            write_s = time.perf_counter() - t0
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()
        t1 = time.perf_counter()
        await asyncio.to_thread(server.start)
        restart_s = time.perf_counter() - t1
        client = aredis.Redis(host="127.0.0.1", port=server.port)
        try:
            survived = int(await client.zcard(key))
        finally:
            with contextlib.suppress(Exception):
                await client.aclose()
        return {
            "mode": mode,
            "written": n,
            "survived": survived,
            "lost": n - survived,
            "write_s": round(write_s, 4),
            "write_rate_per_s": round(n / write_s, 1) if write_s > 0 else None,
            "restart_s": round(restart_s, 3),
        }
    finally:
        await asyncio.to_thread(server.cleanup)


def _redis_version() -> str:
    try:
        out = subprocess.run(
            [REDIS_SERVER, "--version"], capture_output=True, text=True, timeout=10
        ).stdout
        for part in out.split():
            if part.startswith("v="):
                return part[2:]
    except Exception:
        pass
    return "?"
