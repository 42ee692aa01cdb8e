"""rmqdelay: exact, plugin-free delayed delivery on RabbitMQ, at least once.

The public names are imported lazily, on first use: ``import rmqdelay`` stays cheap (no
aio-pika, no worker, no pydantic) so that the ``rmqdelay`` command starts fast.
``from rmqdelay import Publisher`` imports what ``Publisher`` needs and nothing else.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what mypy and IDEs see; at run time __getattr__ imports these
    from .amqp.aio_publisher import AsyncPublisher
    from .amqp.parked_queue import ParkedQueue
    from .amqp.publisher import Publisher
    from .amqp.topology_manager import TopologyManager
    from .core.durations import DurationLike, format_ms, parse_duration_us
    from .core.handling.parking import ParkedMessage
    from .core.handling.retry import Backoff, DecodeError, Park, Requeue, Retry, RetryPolicy
    from .core.journal.recurring import RecurringResult, RecurringSchedule
    from .core.layout import Layout
    from .core.plan import DelayPlan, plan_delay
    from .core.publishing.aio_api import AsyncPublisherProtocol
    from .core.publishing.api import PublisherProtocol
    from .core.publishing.outgoing import PublishResult
    from .core.topology import Topology, build_topology
    from .errors import (
        BatchPublishError,
        ConfigurationError,
        ConfirmTimeoutError,
        ConnectionFailedError,
        DelayError,
        InvalidBodyError,
        InvalidDestinationError,
        InvalidMessageError,
        PublisherClosedError,
        PublishError,
        PublishNackedError,
        RecurringError,
        RmqDelayError,
        TopologyConflictError,
        TopologyError,
        UnknownDestinationError,
        UnroutableError,
        WorkerError,
    )
    from .settings import Settings, load_settings, mask_url
    from .testing import AsyncInMemoryPublisher, InMemoryPublisher
    from .worker import Delivery, RunningWorker, Settled, Worker, WorkerHook
    from .worker.context import Context

__all__ = [
    "AsyncInMemoryPublisher",
    "AsyncPublisher",
    "AsyncPublisherProtocol",
    "Backoff",
    "BatchPublishError",
    "ConfigurationError",
    "ConfirmTimeoutError",
    "ConnectionFailedError",
    "Context",
    "DecodeError",
    "DelayError",
    "DelayPlan",
    "Delivery",
    "DurationLike",
    "InMemoryPublisher",
    "InvalidBodyError",
    "InvalidDestinationError",
    "InvalidMessageError",
    "Layout",
    "Park",
    "ParkedMessage",
    "ParkedQueue",
    "PublishError",
    "PublishNackedError",
    "PublishResult",
    "Publisher",
    "PublisherClosedError",
    "PublisherProtocol",
    "RecurringError",
    "RecurringResult",
    "RecurringSchedule",
    "Requeue",
    "Retry",
    "RetryPolicy",
    "RmqDelayError",
    "RunningWorker",
    "Settings",
    "Settled",
    "Topology",
    "TopologyConflictError",
    "TopologyError",
    "TopologyManager",
    "UnknownDestinationError",
    "UnroutableError",
    "Worker",
    "WorkerError",
    "WorkerHook",
    "build_topology",
    "format_ms",
    "load_settings",
    "mask_url",
    "parse_duration_us",
    "plan_delay",
]

# public name -> the module (relative to this package) that defines it
_WHERE: dict[str, str] = {
    "AsyncPublisher": ".amqp.aio_publisher",
    "ParkedQueue": ".amqp.parked_queue",
    "Publisher": ".amqp.publisher",
    "TopologyManager": ".amqp.topology_manager",
    "Context": ".worker.context",
    "DurationLike": ".core.durations",
    "format_ms": ".core.durations",
    "parse_duration_us": ".core.durations",
    "Layout": ".core.layout",
    "PublishResult": ".core.publishing.outgoing",
    "ParkedMessage": ".core.handling.parking",
    "DelayPlan": ".core.plan",
    "plan_delay": ".core.plan",
    "AsyncPublisherProtocol": ".core.publishing.aio_api",
    "PublisherProtocol": ".core.publishing.api",
    "RecurringResult": ".core.journal.recurring",
    "RecurringSchedule": ".core.journal.recurring",
    **dict.fromkeys(
        ("Backoff", "DecodeError", "Park", "Requeue", "Retry", "RetryPolicy"),
        ".core.handling.retry",
    ),
    "Topology": ".core.topology",
    "build_topology": ".core.topology",
    **dict.fromkeys(
        (
            "BatchPublishError",
            "ConfigurationError",
            "ConfirmTimeoutError",
            "ConnectionFailedError",
            "DelayError",
            "InvalidBodyError",
            "InvalidDestinationError",
            "InvalidMessageError",
            "PublisherClosedError",
            "PublishError",
            "PublishNackedError",
            "RecurringError",
            "RmqDelayError",
            "TopologyConflictError",
            "TopologyError",
            "UnknownDestinationError",
            "UnroutableError",
            "WorkerError",
        ),
        ".errors",
    ),
    "Settings": ".settings",
    "load_settings": ".settings",
    "mask_url": ".settings",
    "AsyncInMemoryPublisher": ".testing",
    "InMemoryPublisher": ".testing",
    "RunningWorker": ".worker",
    "Worker": ".worker",
    "Delivery": ".worker",
    "Settled": ".worker",
    "WorkerHook": ".worker",
}


def __getattr__(name: str) -> Any:
    """Import a public name on first use, then keep it in the module's namespace."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where, __name__), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
