"""The registry of handlings the broker took back (core.handling.takeback), without a broker."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rmqdelay.core.handling.takeback import TakenBack, key_of

A = key_of("a", 1_000, 1)
B = key_of("b", None, 2)


def test_an_unknown_message_is_handled() -> None:
    assert TakenBack[str]().claim(A, 0) == "handle"


def test_a_redelivery_waits_for_the_running_handler_then_gets_its_outcome_once() -> None:
    taken = TakenBack[str]()
    assert taken.took_back(A) == 1
    assert taken.running(A)
    assert taken.claim(A, 10) == "wait"
    assert taken.took_back(A) == 2  # the waiting redelivery was taken back too
    assert taken.claim(B, 10) == "handle"  # another message, or another attempt of it
    assert taken.claim(key_of("a", 1_000, 2), 10) == "handle"
    taken.finished(A, "acked", 20)
    assert not taken.running(A)
    assert taken.took_back(A) == 2  # ended: a late notice changes nothing
    assert taken.claim(A, 30) == "acked"
    assert taken.claim(A, 30) == "handle"
    assert len(taken) == 0


def test_a_handling_that_ended_unsettled_lets_the_redelivery_be_handled() -> None:
    taken = TakenBack[str]()
    taken.took_back(A)
    taken.forget(A)
    assert taken.claim(A, 0) == "handle"


def test_an_outcome_nobody_claims_is_forgotten_and_a_running_handling_never() -> None:
    taken = TakenBack[str](keep_ms=100, most=2)
    taken.took_back(A)
    taken.took_back(B)
    taken.finished(B, "retried", 0)
    assert taken.claim(B, 99) == "retried"
    taken.took_back(B)
    taken.finished(B, "parked", 0)
    assert taken.claim(B, 100) == "handle"  # gone to another worker, surely
    assert taken.claim(A, 10**9) == "wait"  # its handler still runs
    for n in range(5):  # past `most`: the oldest outcomes go first
        key = key_of(f"m{n}", None, 1)
        taken.took_back(key)
        taken.finished(key, f"o{n}", n)
    assert len(taken) == 3  # two outcomes, and A's running handler
    assert taken.claim(key_of("m2", None, 1), 5) == "handle"
    assert taken.claim(key_of("m3", None, 1), 5) == "o3"
    assert taken.claim(A, 5) == "wait"


KEYS = [key_of(m, d, n) for m in "ab" for d in (None, 5) for n in (1, 2)]
Op = tuple[str, int, int]  # (what, key index, time step)
ops = st.lists(
    st.tuples(
        st.sampled_from(["took_back", "finished", "forget", "claim"]),
        st.integers(0, len(KEYS) - 1),
        st.integers(0, 50),
    ),
    max_size=60,
)


@given(ops, st.integers(1, 200), st.integers(1, 6))
def test_against_a_model(steps: list[Op], keep_ms: int, most: int) -> None:
    """Whatever the order of events: a redelivery waits exactly while the handler of a
    taken-back message runs; each outcome is given at most once, and only the one
    recorded; running handlings are never forgotten; at most ``most`` outcomes are kept,
    none past ``keep_ms``."""
    taken = TakenBack[int](keep_ms=keep_ms, most=most)
    running: set[int] = set()
    recorded: dict[int, tuple[int, int]] = {}  # key -> (outcome, ended at), oldest first
    now = 0
    serial = 0

    def expire() -> None:
        for k, (_outcome, ended) in list(recorded.items()):
            if len(recorded) > most or now - ended >= keep_ms:
                del recorded[k]
            else:
                break

    for what, k, dt in steps:
        now += dt
        key = KEYS[k]
        if what == "took_back":
            taken.took_back(key)
            if k not in recorded:
                running.add(k)
        elif what == "finished":
            serial += 1
            taken.finished(key, serial, now)
            running.discard(k)
            recorded.pop(k, None)
            recorded[k] = (serial, now)
            expire()
        elif what == "forget":
            taken.forget(key)
            running.discard(k)
            recorded.pop(k, None)
        else:
            expire()
            claim = taken.claim(key, now)
            if k in running:
                assert claim == "wait"
            elif k in recorded:
                assert claim == recorded.pop(k)[0]  # given once, the one recorded
            else:
                assert claim == "handle"
        assert len(taken) == len(running) + len(recorded) <= len(running) + most
        assert all(taken.running(KEYS[i]) for i in running)
