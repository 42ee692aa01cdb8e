"""rmqdelay: exact, plugin-free delayed delivery on RabbitMQ, at least once."""

from .aio_publisher import AsyncPublisher
from .context import Context
from .durations import DurationLike, format_ms, parse_duration_us
from .errors import (
    BatchPublishError,
    ConfigurationError,
    DelayError,
    InvalidBodyError,
    InvalidDestinationError,
    PublisherClosedError,
    PublishError,
    PublishNackedError,
    RmqDelayError,
    TopologyConflictError,
    TopologyError,
    UnknownDestinationError,
    UnroutableError,
)
from .layout import Layout
from .parked import ParkedQueue
from .parking import ParkedMessage
from .planner import DelayPlan, plan_delay
from .publisher import Publisher
from .publishing import PublishResult
from .retry import Backoff, DecodeError, Park, Requeue, Retry, RetryPolicy
from .settings import Settings, load_settings, mask_url
from .topology import Topology, build_topology
from .topology_manager import TopologyManager
from .worker import RunningWorker, Worker, WorkerError

__all__ = [
    "AsyncPublisher",
    "Backoff",
    "BatchPublishError",
    "ConfigurationError",
    "Context",
    "DecodeError",
    "DelayError",
    "DelayPlan",
    "DurationLike",
    "InvalidBodyError",
    "InvalidDestinationError",
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
