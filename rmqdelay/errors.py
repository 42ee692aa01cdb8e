"""Every error rmqdelay raises on purpose derives from :class:`RmqDelayError`.

A caller can catch the base class, or one cause: each message names what to fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "AccessRefusedError",
    "BatchPublishError",
    "ConfigurationError",
    "ConfirmTimeoutError",
    "ConnectionFailedError",
    "DelayError",
    "InvalidBodyError",
    "InvalidDestinationError",
    "InvalidMessageError",
    "JournalError",
    "PublishError",
    "PublishNackedError",
    "PublisherClosedError",
    "RecurringError",
    "RmqDelayError",
    "TopologyConflictError",
    "TopologyError",
    "UnknownDestinationError",
    "UnroutableError",
    "WorkerError",
]


class RmqDelayError(Exception):
    """Base class of the errors rmqdelay raises on purpose."""


class ConfigurationError(RmqDelayError, ValueError):
    """Settings that cannot work, such as a tier TTL over RabbitMQ's cap."""


class DelayError(RmqDelayError, ValueError):
    """A delay or due time that cannot be planned: negative, too long, NaN, naive."""


class RecurringError(RmqDelayError, ValueError):
    """A recurring schedule that cannot be added or changed: its name, its rule, or a
    schedule of that name that exists with another rule."""


class InvalidBodyError(RmqDelayError, TypeError):
    """A body that cannot be serialized to bytes."""


class InvalidDestinationError(RmqDelayError, ValueError):
    """A destination name that cannot become a queue name and a routing key."""


class InvalidMessageError(RmqDelayError, ValueError):
    """A message AMQP cannot carry as given: a header, a property or its size.

    Raised before anything is sent, by both publishers alike; ``field`` names what to
    fix (``"correlation_id"``, ``"headers['k']"``) and ``reason`` the limit it breaks.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field, self.reason = field, reason
        super().__init__(f"{field} {reason}")


class UnknownDestinationError(RmqDelayError):
    """The destination's work queue does not exist; run `rmqdelay topology apply`."""


class AccessRefusedError(RmqDelayError):
    """The broker refused this user access to a queue (403): a permission to grant."""

    def __init__(self, queue: str, detail: str) -> None:
        self.queue, self.detail = queue, detail
        super().__init__(f"access to queue {queue!r} refused ({detail})")


class PublishError(RmqDelayError):
    """A publish whose delivery the broker did not confirm."""


class UnroutableError(PublishError):
    """The broker returned the message (mandatory): nothing was bound to take it."""


class ConfirmTimeoutError(PublishError):
    """No confirm came within ``confirm_timeout``: the message may or may not be queued.

    A publisher that opened its own connection takes it as a sign that its node is cut
    off from the cluster's majority: it reconnects, trying that node last, and sends the
    message again (same id and due time) before raising this.
    """


class PublishNackedError(PublishError):
    """The broker refused the message with basic.nack (for example a full queue)."""


class PublisherClosedError(PublishError):
    """The connection or channel closed before the broker confirmed the message."""


class BatchPublishError(PublishError):
    """Some messages of a batch were not confirmed; the others were.

    ``failures`` maps each failed message id to its error; publish those again.
    ``results`` holds the :class:`~rmqdelay.PublishResult` of each confirmed message, in
    the order of the requests (typed ``Any`` here: the errors import nothing of the core,
    which raises them).
    """

    def __init__(
        self,
        failures: dict[str, PublishError],
        confirmed: int,
        results: Sequence[Any] = (),
    ) -> None:
        self.failures = failures
        self.confirmed = confirmed
        self.results = list(results)
        first_id, first = next(iter(failures.items()))
        super().__init__(
            f"{len(failures)} of {len(failures) + confirmed} messages were not confirmed; "
            f"first, {first_id}: {first}"
        )


class TopologyError(RmqDelayError):
    """The broker's objects are missing or differ from what the settings describe."""


class ConnectionFailedError(TopologyError):
    """No connection to the broker could be opened: the URL, TLS or the network.

    ``transient`` says whether trying again can help: True for a refused, reset or
    timed-out connection or a broker restarting; False for what only a change of
    settings or permissions fixes (credentials, an unknown virtual host, no access to
    it, an untrusted certificate). A worker retries the first and stops on the second.

    It subclasses :class:`TopologyError` only so that code written when connection
    failures were reported under that name still catches them.
    """

    def __init__(self, message: str, *, transient: bool = True) -> None:
        self.transient = transient
        super().__init__(message)


class WorkerError(RmqDelayError):
    """The worker cannot run: a missing work queue, refused access, a bad queue name."""


class TopologyConflictError(TopologyError):
    """An object exists with other arguments; RabbitMQ will not change them in place."""

    def __init__(
        self, kind: str, name: str, argument: str, found: str, wanted: str, detail: str = ""
    ) -> None:
        self.kind, self.name, self.argument = kind, name, argument
        self.found, self.wanted = found, wanted
        super().__init__(
            f"{kind} {name!r} exists with {argument}={found}, but the settings want "
            f"{argument}={wanted}. RabbitMQ cannot change it in place: delete it (after "
            f"draining it) or change the settings back.{(' ' + detail) if detail else ''}"
        )


class JournalError(RmqDelayError):
    """The schedule journal could not be read to its end in time."""
