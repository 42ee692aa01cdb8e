"""Every reach into pika's private internals, in this one module, checked before use.

pika's public blocking API waits for the broker for ever (a channel's opening, a close,
each confirm: one round trip per message, with no deadline). rmqdelay's fast path drives
pika's I/O loop itself and writes frames it encoded, which takes pika's internals: the
SelectConnection under a BlockingConnection (``_impl``), its close result
(``_closed_result``), its frame output (``_output_marshaled_frames``), the channel's
cookie (``_set_cookie``) and the socket (``_transport._sock``).

At import, :func:`self_check` tests pika's version against the bounds rmqdelay was
checked on (those of ``pyproject.toml``) and that every class attribute used here
exists; instance attributes are checked on the first connection. If anything is off, one
warning is logged and :data:`FAST` turns False: every caller then takes pika's public
API (:mod:`.blocking`, :mod:`.pika_confirms`). ``RMQDELAY_CLIENT_FAST=0`` forces that.

Two reaches are not for speed but for correctness, and so ignore that switch. pika
rejects what a stream consumer still buffers when its channel closes, and RabbitMQ
answers a reject on a stream by closing the whole connection:
:func:`drop_deliveries` makes pika drop them instead (a stream's unacked deliveries are
released with the channel anyway); the public fallback drains the consumer first
(:mod:`.streams`). And pika reads a
header value of type ``f`` or ``d`` (float, double) as an int, ``1.5`` as ``1``
(``pika.data.decode_value``; Java's ``Double``, .NET's ``double`` and every non-integer
JavaScript number are sent as ``d``), and pika 1.3 reads a signed 64-bit ``l`` as
unsigned. The x-delay bridge consumes its inbox with pika and must hand headers on as
they came: :func:`mend_headers_in_this_thread` wraps that decoder once (its tables and
arrays call it by that name) so that it reads those types right in a thread that asked,
the bridge's inbox thread, and is pika's own everywhere else. With a pika outside the
checked versions the decoder is left alone, with one warning.
"""

from __future__ import annotations

import contextlib
import logging
import re
import select
import struct
import threading
from collections.abc import Callable
from typing import Any

import pika
import pika.channel
import pika.connection
import pika.data
import pika.exceptions
from pika.adapters import select_connection
from pika.adapters.blocking_connection import BlockingChannel

from .publishing import CLIENT_FAST_ENV, client_fast

__all__ = [
    "FAST",
    "PIKA_BOUNDS",
    "close_connection",
    "drop_deliveries",
    "headers_mended",
    "mend_headers_in_this_thread",
    "open_channel",
    "poll_once",
    "self_check",
    "server_properties",
    "usable",
    "wait_until",
    "write_frames",
]

log = logging.getLogger("rmqdelay.pika")

PIKA_BOUNDS = ((1, 3), (1, 5))
"""The pika versions the fast path was checked on: at least the first, below the second
(keep equal to ``pyproject.toml``'s pika line)."""
SWITCH = CLIENT_FAST_ENV
"""The environment variable that, set to ``0``, forces the client libraries' public API."""

_CLASS_ATTRIBUTES: tuple[tuple[type, tuple[str, ...]], ...] = (
    (pika.connection.Connection, ("_output_marshaled_frames", "_terminate_stream", "channel")),
    (pika.channel.Channel, ("_set_cookie", "_raise_if_not_open", "add_on_close_callback")),
    (select_connection.IOLoop, ("poll", "process_timeouts", "call_later", "remove_timeout")),
)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def self_check(version: str | None = None) -> str | None:
    """Why the fast path cannot be trusted with this pika, or None when it can."""
    version = pika.__version__ if version is None else version
    low, below = PIKA_BOUNDS
    if not low <= _version(version) < below:
        bounds = f">={'.'.join(map(str, low))},<{'.'.join(map(str, below))}"
        return f"pika {version} is outside the versions checked ({bounds})"
    for cls, names in _CLASS_ATTRIBUTES:
        missing = [name for name in names if not hasattr(cls, name)]
        if missing:
            return f"pika {version}'s {cls.__name__} lacks {', '.join(missing)}"
    return None


def _decide() -> bool:
    if not client_fast():
        return False  # asked for: no warning
    problem = self_check()
    if problem is not None:
        _warn(problem)
    return problem is None


def _warn(problem: str) -> None:
    log.warning(
        "%s: rmqdelay uses pika's public API instead (one confirm round trip per message; "
        "waits on a silent broker end with the connection's heartbeat, not confirm_timeout)",
        problem,
    )


FAST: bool = _decide()
"""Whether rmqdelay takes its fast path through pika's internals (read at each use)."""
_instances_checked = False


def usable(connection: pika.BlockingConnection) -> bool:
    """Whether the fast path may be taken on ``connection``: :data:`FAST`, and on the
    first connection seen, its instance attributes are what this module expects."""
    global FAST, _instances_checked
    if not FAST or _instances_checked:
        return FAST
    impl = vars(connection).get("_impl")
    result = vars(connection).get("_closed_result")
    ioloop = getattr(impl, "ioloop", None)
    if not isinstance(impl, pika.connection.Connection) or not hasattr(result, "ready"):
        _warn(f"pika {pika.__version__}'s BlockingConnection has no _impl or _closed_result")
        FAST = False
    elif not isinstance(ioloop, select_connection.IOLoop):
        _warn(f"pika {pika.__version__}'s connection runs on {type(ioloop).__name__}")
        FAST = False
    _instances_checked = True
    return FAST


def _impl(connection: pika.BlockingConnection) -> Any:
    return connection._impl  # type: ignore[attr-defined]


def _closed_error(connection: pika.BlockingConnection) -> BaseException | None:
    result: Any = connection._closed_result  # type: ignore[attr-defined]
    return result.value.error if result.ready else None


def wait_until(
    connection: pika.BlockingConnection, done: Callable[[], bool], timeout: float, what: str
) -> None:
    """Process I/O until ``done()``; raise why the connection closed, or TimeoutError.

    pika's own waits keep its I/O loop going while output is unsent, and its timers
    fire only inside ``process_data_events``: a broker that stops answering hangs them.
    """
    ioloop = _impl(connection).ioloop
    expired: list[bool] = []
    timer = ioloop.call_later(timeout, lambda: expired.append(True))  # wakes the poll
    try:
        while not done() and not expired and _closed_error(connection) is None:
            ioloop.poll()
            ioloop.process_timeouts()
    finally:
        ioloop.remove_timeout(timer)
    if done():
        return
    error = _closed_error(connection)
    if error is not None:
        raise error
    raise TimeoutError(f"no answer from the broker within {timeout:g}s ({what})")


def poll_once(connection: pika.BlockingConnection) -> None:
    """Handle what has already arrived (a close, say) without waiting; raise why it closed.

    ``process_data_events(0)`` would also wait for unsent output to drain. Nothing to
    read is the usual case, before every publish: one ``select`` on the socket answers it
    (a few µs) where a turn of pika's I/O loop costs tens (bench/README.md).
    """
    if not _readable(connection):
        return
    with contextlib.suppress(TimeoutError):
        wait_until(connection, lambda: False, 0, "polling")


def _readable(connection: pika.BlockingConnection) -> bool:
    """Whether the socket holds input; True when unsure (no socket found, TLS with bytes
    already decrypted and buffered, a closed socket): then the I/O loop is asked."""
    sock = getattr(getattr(_impl(connection), "_transport", None), "_sock", None)
    if sock is None or sock.fileno() < 0:
        return True
    pending = getattr(sock, "pending", None)  # an ssl.SSLSocket
    if pending is not None and pending():
        return True
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


def write_frames(channel: pika.channel.Channel, data: bytes) -> None:
    """Queue frames already encoded (:func:`~rmqdelay.core.wire.encode_publish`) as one
    write: pika sends each frame it builds with a system call of its own."""
    channel._raise_if_not_open()  # type: ignore[attr-defined]  # as basic_publish does
    channel.connection._output_marshaled_frames([data])  # type: ignore[attr-defined]


def open_channel(connection: pika.BlockingConnection, timeout: float) -> pika.channel.Channel:
    """A channel opened with a deadline (pika waits for Channel.OpenOk for ever): the
    channel under the BlockingChannel, whose callbacks run as frames arrive."""
    opened: list[pika.channel.Channel] = []
    impl: pika.channel.Channel = _impl(connection).channel(on_open_callback=opened.append)
    # as BlockingConnection.channel does: its close and dispatch look for this wrapper
    impl._set_cookie(BlockingChannel(impl, connection))  # type: ignore[attr-defined]
    wait_until(connection, lambda: bool(opened) or impl.is_closed, timeout, "opening a channel")
    if not opened:
        raise pika.exceptions.ChannelClosed(0, "the broker closed the channel as it opened")
    return impl


def close_connection(connection: pika.BlockingConnection, timeout: float) -> None:
    """Close with a deadline; past it, drop the socket. Never raises for a closed one."""
    impl = _impl(connection)
    gone = (TimeoutError, pika.exceptions.AMQPError, OSError)
    try:
        impl.close(200, "Normal shutdown")  # closes its channels first, without waiting
        wait_until(connection, lambda: connection.is_closed, timeout, "closing the connection")
    except TimeoutError:
        impl._terminate_stream(pika.exceptions.ConnectionClosedByClient(200, "close timed out"))
        with contextlib.suppress(*gone):
            wait_until(connection, lambda: connection.is_closed, 1.0, "dropping the socket")
    except gone:
        pass  # it closed some other way: closed either way


def drop_deliveries(channel: BlockingChannel) -> bool:
    """Make ``channel``'s consumers drop, not reject, what pika buffers for them and what
    arrives until the broker stops sending (what pika does for a no-ack consumer); call
    it before the channel or its connection closes. False, and nothing changed, when
    this pika is not the one checked: the caller drains the consumers instead."""
    infos = vars(channel).get("_consumer_infos")
    noack = vars(vars(channel).get("_impl") or object()).get("_consumers_with_noack")
    if (
        self_check() is not None
        or not isinstance(infos, dict)
        or not isinstance(noack, set)
        or not all(hasattr(info, "auto_ack") for info in infos.values())
    ):
        return False
    for tag, info in infos.items():
        info.auto_ack = True
        noack.add(tag)
    return True


def server_properties(connection: object) -> dict[str, Any]:
    """What the broker said of itself as the connection opened (``cluster_name``...);
    empty on the public path, where pika's BlockingConnection does not expose them."""
    if not isinstance(connection, pika.BlockingConnection) or not usable(connection):
        return {}
    found = getattr(_impl(connection), "server_properties", None)
    return dict(found) if isinstance(found, dict) else {}


_DOUBLE = struct.Struct(">d").unpack_from
_FLOAT = struct.Struct(">f").unpack_from
_SIGNED = struct.Struct(">q").unpack_from
_HEADERS = threading.local()
_HEADERS_LOCK = threading.Lock()
Decoder = Callable[[bytes, int], tuple[Any, int]]


def headers_mended() -> bool:
    """Whether pika reads header values right in this thread."""
    return bool(getattr(_HEADERS, "mend", False)) and _decoder_wrapped()


def _decoder_wrapped() -> bool:
    return bool(getattr(pika.data.decode_value, "_rmqdelay_original", None))


def _wrap_decoder() -> bool:
    """Wrap pika's decoder once (it changes nothing until a thread asks); False, with one
    warning, when this pika is not one the wrapper was checked on."""
    with _HEADERS_LOCK:
        if _decoder_wrapped():
            return True
        problem = self_check()
        if problem is None and not callable(getattr(pika.data, "decode_value", None)):
            problem = f"pika {pika.__version__} has no pika.data.decode_value"
        if problem is not None:
            log.warning(
                "%s: header values of type float or double are read as pika reads them "
                "(1.5 as 1) by the x-delay bridge",
                problem,
            )
            return False
        original: Decoder = pika.data.decode_value

        def decode_value(encoded: bytes, offset: int) -> tuple[Any, int]:
            if getattr(_HEADERS, "mend", False):
                kind = encoded[offset : offset + 1]
                if kind == b"d":
                    return _DOUBLE(encoded, offset + 1)[0], offset + 9
                if kind == b"f":
                    return _FLOAT(encoded, offset + 1)[0], offset + 5
                if kind == b"l":
                    return _SIGNED(encoded, offset + 1)[0], offset + 9
            return original(encoded, offset)

        decode_value._rmqdelay_original = original  # type: ignore[attr-defined]
        pika.data.decode_value = decode_value
        return True


def mend_headers_in_this_thread(mend: bool = True) -> None:
    """Read header values right in the calling thread (wrapping the decoder first)."""
    wrapped = _wrap_decoder()
    _HEADERS.mend = mend and wrapped
