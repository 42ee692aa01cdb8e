"""The errors a publish raises, written once for every adapter.

Each names what happened and what to do; the adapters (pika, aio-pika, the in-memory
stub) only pick which one applies, so a message reads the same whichever client sent.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import (
    ConfigurationError,
    ConfirmTimeoutError,
    PublisherClosedError,
    PublishError,
    PublishNackedError,
    TopologyError,
    UnknownDestinationError,
    UnroutableError,
)
from .journal.records import journal_name
from .journal.reschedule import RescheduleResult
from .layout import Layout
from .publishing.outgoing import Outgoing

__all__ = [
    "journal_missing",
    "journal_off",
    "lost",
    "nacked",
    "no_confirm",
    "no_exchange",
    "not_connected",
    "not_sent",
    "reschedule_needs_body",
    "returned",
    "unconfirmed",
    "unjournaled",
    "unknown_destination",
]


def journal_missing(layout: Layout) -> TopologyError:
    return TopologyError(
        f"the schedule journal {journal_name(layout)!r} does not exist: run `rmqdelay "
        "topology apply`, or set schedule_journal = false (RMQDELAY_SCHEDULE_JOURNAL=false)"
    )


def journal_off(what: str) -> ConfigurationError:
    """The settings turned the journal off, and ``what`` reads or writes it."""
    return ConfigurationError(
        f"{what} needs the schedule journal, which is off: set schedule_journal = true "
        "(RMQDELAY_SCHEDULE_JOURNAL=true) and run `rmqdelay topology apply`. It shows "
        "only what was published while the journal was on"
    )


def reschedule_needs_body(result: RescheduleResult) -> ConfigurationError:
    """An earlier due time needs a fresh copy, and the journal has no body to make it."""
    return ConfigurationError(
        f"rescheduling {result.target!r} to an earlier time needs a fresh copy of the "
        "message, made from the body its journal record holds, and it holds none: it was "
        "published with journal_bodies = false (RMQDELAY_JOURNAL_BODIES=false; the default "
        "is true). A later time needs no body"
    )


def unjournaled(message_id: str, why: BaseException) -> PublishError:
    """A message confirmed whose journal record was not: delivered, but not listed."""
    return PublishError(
        f"message {message_id} was confirmed but its schedule journal record was not "
        f"({why}): it will be delivered, yet `scheduled list` and `cancel` may not see it"
    )


def unknown_destination(layout: Layout, destination: str) -> UnknownDestinationError:
    queue = layout.work_queue(destination)
    return UnknownDestinationError(
        f"destination {destination!r} has no work queue {queue!r}: run "
        f"`rmqdelay topology apply --destination {destination}`"
    )


def returned(out: Outgoing, reason: str) -> UnroutableError:
    """The broker returned the message: nothing is bound for its destination."""
    return UnroutableError(
        f"the broker returned message {out.message_id} ({reason}): nothing is bound for "
        f"destination {out.prepared.destination!r} via exchange {out.exchange!r}; run "
        "`rmqdelay topology apply`"
    )


def nacked(out: Outgoing) -> PublishNackedError:
    return PublishNackedError(
        f"the broker nacked message {out.message_id} to {out.prepared.destination!r}"
    )


def no_exchange(out: Outgoing, detail: str) -> UnroutableError | PublisherClosedError:
    """The broker closed the channel on a missing exchange (404, ``detail`` its words):
    this message's tier exchange, or another message's, which leaves this one's fate
    unknown (it may have been routed before the close)."""
    if f"'{out.exchange}'" not in detail:
        return unconfirmed(out.message_id, detail)
    return UnroutableError(
        f"message {out.message_id} was not sent: {detail}; run `rmqdelay topology apply`"
    )


def unconfirmed(message_id: str, why: object) -> PublisherClosedError:
    return PublisherClosedError(
        f"the connection closed before message {message_id} was confirmed ({why}); "
        "it may or may not have been delivered: publish it again"
    )


def not_sent(message_id: str, why: object) -> PublisherClosedError:
    """A message of a batch left unsent: sending stopped before it (``why``)."""
    return PublisherClosedError(f"message {message_id} was not sent ({why}): publish it again")


def no_confirm(message_id: str, timeout: float) -> ConfirmTimeoutError:
    return ConfirmTimeoutError(
        f"no confirm for message {message_id} within confirm_timeout={timeout:g}s; it "
        "may or may not have been delivered: publish it again"
    )


def not_connected() -> PublisherClosedError:
    return PublisherClosedError("the publisher is not connected: call connect() first")


def lost(why: object, owned: bool, attempts: Sequence[object] = ()) -> PublisherClosedError:
    """Why a publisher cannot send: its connection dropped and could not be reopened."""
    if not owned:
        return PublisherClosedError(
            f"the connection given to this publisher is closed ({why}): open a new one "
            "and a new publisher on it"
        )
    return PublisherClosedError(
        f"the connection to the broker was lost ({why}) and {len(attempts)} attempts to "
        f"reconnect failed, the last: {attempts[-1] if attempts else '?'}"
    )
