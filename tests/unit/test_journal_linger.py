"""Several publishes' journal writes as one stream message: the merge (pure) and the
asyncio publisher's linger that gathers them (its sender replaced by a recorder; the
broker side is tests/broker/test_journal_linger.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmqdelay import Settings
from rmqdelay.amqp.aio_sending import BYTES_PER_MERGED_WRITE, JournalLinger
from rmqdelay.core.journal.records import RECORDS_PER_WRITE, decode_records
from rmqdelay.core.publishing.outgoing import Outcome, Prepared, lone_write, merged_write
from rmqdelay.core.publishing.publisher import PublisherCore
from rmqdelay.errors import JournalError

pytestmark = pytest.mark.unit
CORE = PublisherCore(Settings(max_delay="2h").layout)


def _write(sizes: Sequence[int], tenant: str | None = None) -> Prepared:
    headers = {"tenant": tenant} if tenant else None
    batch = [
        CORE.prepare("orders", b"x" * size, delay=f"{1 + i}s", headers=headers)
        for i, size in enumerate(sizes)
    ]
    return CORE.journal_write(batch, now_ms=7)


@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 50), min_size=1, max_size=4), st.booleans()),
        min_size=1,
        max_size=6,
    )
)
def test_merged_writes_read_back_as_every_write_in_order(
    spec: list[tuple[list[int], bool]],
) -> None:
    writes = [_write(sizes, "t-1" if tagged else None) for sizes, tagged in spec]
    merged = merged_write(writes)
    assert merged.journal_records == sum(w.journal_records for w in writes)
    assert decode_records(merged.body) == [r for w in writes for r in decode_records(w.body)]
    assert merged.message_id == writes[0].message_id  # one stream message, the first's id


def test_a_keyed_write_is_never_merged() -> None:
    keyed = CORE.journal_write(
        [CORE._prepare_keyed("orders", b"abc", "1m", None, None, "k-1", "ignore")]
    )
    assert keyed.marker is not None
    assert lone_write(keyed) and not lone_write(_write([1]))
    with pytest.raises(ValueError, match="goes alone"):
        merged_write([keyed])
    with pytest.raises(ValueError, match="goes alone"):
        merged_write([_write([1]), keyed])


async def _written(linger: JournalLinger, write: Prepared) -> Outcome:
    """As the publisher waits for a record: shielded, so a cancelled caller's still goes."""
    return await asyncio.shield(linger.add(write))


async def _just_wrote(linger: JournalLinger, recorder: Recorder) -> None:
    """Have ``linger`` write now, so that what comes next waits out the linger (a record
    after a quiet linger goes at once)."""
    await asyncio.wait_for(_written(linger, _write([9])), 5)
    recorder.sent.clear()


class Recorder:
    """A sender that records what it was given and answers with ``answer``."""

    def __init__(self, answer: Outcome | None = None) -> None:
        self.sent: list[list[Prepared]] = []
        self.answer = answer

    async def __call__(self, batch: Sequence[Prepared]) -> list[Outcome]:
        self.sent.append(list(batch))
        await asyncio.sleep(0)
        return [self.answer if self.answer is not None else p.message_id for p in batch]  # type: ignore[misc]


async def test_writes_within_the_linger_go_as_one_and_each_gets_its_outcome() -> None:
    recorder = Recorder()
    linger = JournalLinger(0.05, recorder)
    writes = [_write([1]), _write([2, 3]), _write([4])]
    outcomes: list[object] = list(await asyncio.gather(*(_written(linger, w) for w in writes)))
    assert len(recorder.sent) == 1 and len(recorder.sent[0]) == 1
    assert recorder.sent[0][0].journal_records == 4
    assert outcomes == [writes[0].message_id] * 3  # the merged write's outcome, for each


async def test_a_full_write_goes_at_once_and_never_over_the_records_per_write() -> None:
    recorder = Recorder()
    linger = JournalLinger(60.0, recorder)  # only the count can send it
    await _just_wrote(linger, recorder)
    big = _write([0] * (RECORDS_PER_WRITE - 1))
    first = asyncio.ensure_future(_written(linger, big))
    second = asyncio.ensure_future(_written(linger, _write([0, 0])))  # would overflow: alone
    third = asyncio.ensure_future(_written(linger, _write([0] * (RECORDS_PER_WRITE - 2))))  # fills
    await asyncio.wait_for(asyncio.gather(first, second, third), 5)
    assert [[p.journal_records for p in batch] for batch in recorder.sent] == [
        [RECORDS_PER_WRITE - 1],
        [RECORDS_PER_WRITE],
    ]


async def test_a_failed_write_fails_every_publish_it_recorded() -> None:
    refused = JournalError("a journal write was refused (test)")
    linger = JournalLinger(0.01, Recorder(refused))
    outcomes: list[object] = list(
        await asyncio.gather(_written(linger, _write([1])), _written(linger, _write([2])))
    )
    assert outcomes == [refused, refused]


async def test_close_sends_what_is_pending_and_waits_for_it() -> None:
    recorder = Recorder()
    linger = JournalLinger(60.0, recorder)
    await _just_wrote(linger, recorder)
    pending = asyncio.ensure_future(_written(linger, _write([1])))
    await asyncio.sleep(0)
    await linger.close()
    assert len(recorder.sent) == 1
    assert pending.done()


async def test_a_cancelled_publish_still_sends_its_record() -> None:
    recorder = Recorder()
    linger = JournalLinger(0.01, recorder)
    waiting = asyncio.ensure_future(_written(linger, _write([1])))
    await asyncio.sleep(0)
    waiting.cancel()
    await linger.close()
    assert len(recorder.sent) == 1


async def test_a_publish_in_turn_sends_its_record_once_its_messages_are_done() -> None:
    """A caller awaiting each publish in turn waits for its message, not the linger."""
    recorder = Recorder()
    linger = JournalLinger(60.0, recorder)
    await _just_wrote(linger, recorder)
    linger.returned()  # the caller's last publish returned just now
    with linger.publishing():
        written = linger.add(_write([1]))
        await asyncio.sleep(0)
        assert recorder.sent == []  # not before its message is done
    assert await asyncio.wait_for(asyncio.shield(written), 5) is not None
    assert len(recorder.sent) == 1


async def test_a_record_after_a_quiet_linger_goes_at_once() -> None:
    """A service publishing now and then waits for no one: nothing was written within
    the linger, so its record goes on the loop's next turn."""
    recorder = Recorder()
    linger = JournalLinger(60.0, recorder)
    with linger.publishing():  # nothing returned before: not a caller's next
        one = linger.add(_write([1]))
    await asyncio.wait_for(one, 5)
    assert [[p.journal_records for p in batch] for batch in recorder.sent] == [[1]]


async def test_records_soon_after_a_write_wait_for_the_rest_of_the_linger() -> None:
    """At most one write a linger: the records that come within it go together."""
    recorder = Recorder()
    linger = JournalLinger(0.2, recorder)
    first = linger.add(_write([1]))
    await asyncio.wait_for(first, 5)  # the first went at once
    with linger.publishing():  # not in turn: no caller's return before it
        two = linger.add(_write([2]))
    await asyncio.sleep(0.01)  # the last return is 10 ms old: not in turn either
    with linger.publishing():
        three = linger.add(_write([3, 4]))
    await asyncio.sleep(0.05)
    assert len(recorder.sent) == 1  # both wait: the last write is younger than the linger
    await asyncio.wait_for(asyncio.gather(two, three), 5)
    assert [[p.journal_records for p in batch] for batch in recorder.sent] == [[1], [3]]


async def test_a_publish_beside_another_in_flight_is_not_in_turn() -> None:
    recorder = Recorder()
    linger = JournalLinger(60.0, recorder)
    await _just_wrote(linger, recorder)
    other = linger.publishing()
    other.__enter__()  # another publish in flight, begun long ago
    linger.returned()
    with linger.publishing():  # right after a return, but not alone
        linger.add(_write([1]))
    await asyncio.sleep(0)
    assert recorder.sent == []
    other.__exit__(None, None, None)  # that one was not in turn: nothing goes
    await asyncio.sleep(0)
    assert recorder.sent == []
    await linger.close()
    assert len(recorder.sent) == 1


async def test_merged_writes_stay_under_the_byte_bound() -> None:
    """Records keep their bodies: a big one's write is sent before the next joins it."""
    recorder = Recorder()
    linger = JournalLinger(60.0, recorder)
    half = BYTES_PER_MERGED_WRITE // 2 + 1
    big = dataclasses.replace(_write([1]), body=b"x" * half)  # as if it kept a body
    first = linger.add(big)
    second = linger.add(big)  # both together would pass the bound
    await linger.close()
    assert first.done() and second.done()
    assert [len(batch[0].body) for batch in recorder.sent] == [half, half]
