"""The worker's ack batching (rmqdelay.core.handling.acks), against a model of a channel's
broker side.

The model holds what the broker holds unacked on the channel and applies each frame
when it leaves, in the order the worker sends them: a ``multiple`` ack when it is
planned (the worker sends it before the next plan), a single ack, reject or nack when
the ledger is told it is out (``sent``). It fails on what RabbitMQ would refuse (a
frame for a tag it does not hold: PRECONDITION_FAILED, the channel closes) and on what
at least once forbids (an ack covering a delivery not done, or one rejected).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqdelay.core.handling.acks import AckLedger, AckPlan, TagState


@dataclass
class Channel:
    ledger: AckLedger = field(default_factory=AckLedger)
    held: set[int] = field(default_factory=set)
    """What the broker holds unacked."""
    next_tag: int = 1
    open: list[int] = field(default_factory=list)
    """Delivered, handling not ended."""
    done: set[int] = field(default_factory=set)
    rejecting: list[int] = field(default_factory=list)
    singles: list[int] = field(default_factory=list)
    acked: list[int] = field(default_factory=list)
    frames: int = 0

    def deliver(self) -> None:
        tag = self.next_tag
        self.next_tag += 1
        self.held.add(tag)
        self.open.append(tag)
        self.ledger.delivered(tag)

    def finish(self, i: int) -> None:
        tag = self.open.pop(i % len(self.open))
        self.done.add(tag)
        self.ledger.done(tag)

    def reject(self, i: int) -> None:
        tag = self.open.pop(i % len(self.open))
        self.ledger.sending(tag)
        self.rejecting.append(tag)

    def take_back(self, i: int) -> None:
        """The broker cancelled the consumer: the delivery is no longer held here."""
        tag = self.open.pop(i % len(self.open))
        self.held.discard(tag)
        self.ledger.forget(tag)

    def frame_out(self, i: int) -> None:
        """A reject, or a single ack of an earlier plan, leaves."""
        pending = self.rejecting + self.singles
        tag = pending[i % len(pending)]
        assert tag in self.held, f"a frame for tag {tag}, which the broker no longer holds"
        self.held.discard(tag)
        self.frames += 1
        if tag in self.rejecting:
            self.rejecting.remove(tag)
        else:
            self.singles.remove(tag)
            self.acked.append(tag)
        self.ledger.sent(tag)

    def flush(self) -> AckPlan:
        plan = self.ledger.take()
        if plan.multiple is not None:
            top = plan.multiple
            assert top in self.held, f"multiple ack of tag {top}, which the broker does not hold"
            covered = {t for t in self.held if t <= top}
            assert covered <= self.done, f"would ack {sorted(covered - self.done)}, not done"
            assert len(covered) == plan.covered
            self.held -= covered
            self.acked.extend(covered)
            self.frames += 1
        for tag in plan.singles:
            assert tag in self.done
            self.singles.append(tag)
        return plan


ACTIONS = ["deliver"] * 3 + ["finish"] * 2 + ["reject", "back", "out"] + ["flush"] * 2
actions = st.lists(st.tuples(st.sampled_from(ACTIONS), st.integers(0, 7)), max_size=40)


@settings(max_examples=500, deadline=None)
@given(actions)
def test_batches_ack_only_done_deliveries_each_once(steps: list[tuple[str, int]]) -> None:
    channel = Channel()
    for action, i in steps:
        if action == "deliver":
            channel.deliver()
        elif action == "finish" and channel.open:
            channel.finish(i)
        elif action == "reject" and channel.open:
            channel.reject(i)
        elif action == "back" and channel.open:
            channel.take_back(i)
        elif action == "out" and (channel.rejecting or channel.singles):
            channel.frame_out(i)
        elif action == "flush":
            channel.flush()
    # the end: every frame out, every handling ended, flushed
    while channel.rejecting or channel.singles:
        channel.frame_out(0)
    while channel.open:
        channel.finish(0)
    channel.flush()
    while channel.singles:
        channel.frame_out(0)
    assert sorted(channel.acked) == sorted(channel.done), "each done delivery acked once"
    assert not channel.held
    assert channel.ledger.pending == 0


def test_a_run_goes_as_one_multiple_ack_and_past_a_gap_alone() -> None:
    ledger = AckLedger()
    for tag in range(1, 7):
        ledger.delivered(tag)
    for tag in (1, 2, 3, 5, 6):
        ledger.done(tag)
    plan = ledger.take()
    assert (plan.multiple, plan.covered, plan.singles) == (3, 3, (5, 6))
    assert ledger.state(5) is TagState.SENDING  # no batch covers it until it is out
    ledger.done(4)
    plan = ledger.take()  # 5 and 6 still on their way: 4 goes alone
    assert (plan.multiple, plan.covered, plan.singles) == (4, 1, ())
    ledger.sent(5)
    ledger.sent(6)
    for tag in (7, 8):
        ledger.delivered(tag)
        ledger.done(tag)
    plan = ledger.take()
    assert (plan.multiple, plan.covered, plan.singles) == (8, 2, ())
    assert len(ledger) == 0 and ledger.floor == 8


def test_a_reject_on_its_way_holds_back_the_run_above_it() -> None:
    ledger = AckLedger()
    for tag in (1, 2, 3):
        ledger.delivered(tag)
    ledger.sending(1)
    ledger.done(2)
    ledger.done(3)
    plan = ledger.take()
    assert plan.multiple is None and plan.singles == (2, 3)


def test_an_undelivered_tag_breaks_the_run() -> None:
    """Tags are consecutive: a delivery whose callback has not run yet is not done."""
    ledger = AckLedger()
    ledger.delivered(1)
    ledger.delivered(3)
    ledger.done(1)
    ledger.done(3)
    plan = ledger.take()
    assert (plan.multiple, plan.covered, plan.singles) == (1, 1, (3,))


def test_settling_twice_is_a_bug_it_names() -> None:
    ledger = AckLedger()
    ledger.delivered(1)
    ledger.done(1)
    with pytest.raises(ValueError, match="delivery tag 1 is done"):
        ledger.sending(1)
    ledger.take()
    with pytest.raises(ValueError, match="delivery tag 1 is settled"):
        ledger.done(1)
