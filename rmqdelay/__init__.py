"""rmqdelay: exact, plugin-free delayed delivery on RabbitMQ, at least once."""

from .amqp.aio_publisher import AsyncPublisher
from .amqp.parked_queue import ParkedQueue
from .amqp.publisher import Publisher
from .amqp.topology_manager import TopologyManager
from .core.context import Context
from .core.durations import DurationLike, format_ms, parse_duration_us
from .core.layout import Layout
from .core.outgoing import PublishResult
from .core.parking import ParkedMessage
from .core.plan import DelayPlan, plan_delay
from .core.retry import Backoff, DecodeError, Park, Requeue, Retry, RetryPolicy
from .core.topology import Topology, build_topology
from .errors import (
    BatchPublishError,
    ConfigurationError,
    ConnectionFailedError,
    DelayError,
    InvalidBodyError,
    InvalidDestinationError,
    InvalidMessageError,
    PublisherClosedError,
    PublishError,
    PublishNackedError,
    RmqDelayError,
    TopologyConflictError,
    TopologyError,
    UnknownDestinationError,
    UnroutableError,
    WorkerError,
)
from .settings import Settings, load_settings, mask_url
from .worker import RunningWorker, Worker

__all__ = [
    "AsyncPublisher",
    "Backoff",
    "BatchPublishError",
    "ConfigurationError",
    "ConnectionFailedError",
    "Context",
    "DecodeError",
    "DelayError",
    "DelayPlan",
    "DurationLike",
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
    "Requeue",
    "Retry",
    "RetryPolicy",
    "RmqDelayError",
    "RunningWorker",
    "Settings",
    "Topology",
    "TopologyConflictError",
    "TopologyError",
    "TopologyManager",
    "UnknownDestinationError",
    "UnroutableError",
    "Worker",
    "WorkerError",
    "build_topology",
    "format_ms",
    "load_settings",
    "mask_url",
    "parse_duration_us",
    "plan_delay",
]
