"""The hops workload's floor: the broker-alone chain waits exactly the delay it names.

Its lateness and CPU per message are read against rmqdelay's, so its TTLs must add up to
``delay_ms`` (a chain shorter than its delay would look early, a longer one late) and a
spread hop must be queues of their own, taken in turn.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.peers.hopchain import HopChainPeer


@given(hops=st.integers(1, 8), delay_ms=st.integers(8, 100_000))
def test_the_ttls_add_up_to_the_delay(hops: int, delay_ms: int) -> None:
    peer = HopChainPeer("amqp://127.0.0.1", hops=hops, delay_ms=delay_ms)
    assert sum(peer.ttls) == delay_ms
    assert len(peer.ttls) == hops
    assert max(peer.ttls) - min(peer.ttls) <= 1


def test_a_spread_hop_is_queues_of_its_own_taken_in_turn() -> None:
    peer = HopChainPeer("amqp://127.0.0.1", hops=2, delay_ms=1000, spread=3)
    queues = [q for lane in peer.lanes for q in lane]
    assert len(set(queues)) == 6
    firsts = [peer._first() for _ in range(6)]
    assert sorted(set(firsts)) == sorted(lane[0] for lane in peer.lanes)
    assert firsts[:3] == firsts[3:]


def test_expiration_is_refused_beyond_one_hop() -> None:
    with pytest.raises(ValueError, match="strips expiration"):
        HopChainPeer("amqp://127.0.0.1", hops=2, expiration=True)
