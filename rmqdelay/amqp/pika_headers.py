"""Header values as they came, in pika, for the x-delay bridge's inbox thread.

pika reads a header value of type ``f`` (float) or ``d`` (double) as an int, ``1.5`` as
``1`` (``pika/data.py``, ``decode_value``; Java's ``Double``, .NET's ``double`` and every
non-integer JavaScript number are sent as ``d``), and pika 1.3 reads a signed 64-bit
``l`` as unsigned. The bridge consumes its inbox with pika (its consumer costs less than
half of aiormq's CPU per delivery) and must hand headers on as they came.

:func:`install` wraps ``pika.data.decode_value`` (its tables and arrays call it by that
name) once; the wrapper reads those types right only in a thread that asked for it with
:func:`mend_this_thread`, the bridge's inbox thread, and in every other thread it is
pika's own: nothing else in the process sees a change.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from typing import Any

import pika.data

__all__ = ["install", "mend_this_thread", "mended"]

_DOUBLE = struct.Struct(">d").unpack_from
_FLOAT = struct.Struct(">f").unpack_from
_SIGNED = struct.Struct(">q").unpack_from
_LOCAL = threading.local()
_LOCK = threading.Lock()
Decoder = Callable[[bytes, int], tuple[Any, int]]


def mended() -> bool:
    """Whether pika reads header values right in this thread."""
    return bool(getattr(_LOCAL, "mend", False)) and _installed()


def _installed() -> bool:
    return bool(getattr(pika.data.decode_value, "_rmqdelay_original", None))


def install() -> None:
    """Wrap pika's decoder (once); it changes nothing until a thread asks."""
    with _LOCK:
        if _installed():
            return
        original: Decoder = pika.data.decode_value

        def decode_value(encoded: bytes, offset: int) -> tuple[Any, int]:
            if getattr(_LOCAL, "mend", False):
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


def mend_this_thread(mend: bool = True) -> None:
    """Read header values right in the calling thread (installing the wrapper first)."""
    install()
    _LOCAL.mend = mend
