"""The bridge's inbox thread reads header values as pamqp (aiormq's decoder) does, floats
and 64-bit ints included; every other thread keeps pika's own reading."""

from __future__ import annotations

import struct
import threading
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pika.data
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import decode as pamqp_decode

from rmqdelay.amqp import pika_private
from rmqdelay.core.wire import encode_properties

values = st.recursive(
    st.one_of(
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=10),
        st.booleans(),
        st.none(),
        st.binary(max_size=5),
        st.decimals(min_value=0, max_value=1000, places=2),
        st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2100, 1, 1)),
    ),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)
DOUBLE = struct.pack(">I", 11) + b"\x01rd" + struct.pack(">d", 1.5)


def in_thread(mend: bool, encoded: bytes) -> Any:
    """pika's reading of a table in a thread of its own, mended or not."""
    found: list[Any] = []

    def read() -> None:
        if mend:
            pika_private.mend_headers_in_this_thread()
        found.append(pika.data.decode_table(encoded, 0)[0])

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    return found[0]


def test_only_a_thread_that_asks_reads_doubles_as_doubles() -> None:
    pika_private.mend_headers_in_this_thread(False)  # wraps the decoder
    assert in_thread(True, DOUBLE) == {"r": 1.5}
    assert in_thread(False, DOUBLE) == {"r": 1}  # pika's own reading, elsewhere
    assert not pika_private.headers_mended()  # this thread did not ask
    single = struct.pack(">I", 7) + b"\x01rf" + struct.pack(">f", 0.25)
    assert in_thread(True, single) == {"r": 0.25}


@given(st.dictionaries(st.text(min_size=1, max_size=10), values, max_size=6))
def test_a_mended_thread_reads_a_table_as_pamqp_does(table: dict[str, Any]) -> None:
    encoded = encode_properties({"headers": table})[2:]  # past the property flags
    _size, by_pamqp = pamqp_decode.field_table(encoded)
    assert normal(in_thread(True, encoded)) == normal(by_pamqp)


def normal(value: Any) -> Any:
    """Equal values whatever their class (pika's int subclass, bytearray, naive UTC)."""
    if isinstance(value, dict):
        return {k: normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normal(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, datetime):
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, Decimal):
        return value.normalize()
    return value


def test_a_pika_outside_the_checked_versions_keeps_its_own_reading(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = getattr(pika.data.decode_value, "_rmqdelay_original", pika.data.decode_value)
    monkeypatch.setattr(pika.data, "decode_value", original)  # not wrapped yet
    monkeypatch.setattr(pika, "__version__", "1.5.0")
    assert in_thread(True, DOUBLE) == {"r": 1}  # asked, but not mended
    assert pika.data.decode_value is original
    assert "pika 1.5.0 is outside the versions checked" in caplog.text
    assert "read as pika reads them" in caplog.text
