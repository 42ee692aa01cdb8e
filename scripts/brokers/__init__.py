"""Find or start a RabbitMQ broker for rmqdelay's tests, demo and benchmarks.

Modules, each usable on its own:

- ``base``      -- BrokerInfo, BrokerUnavailable, SecretUrl, mask_url, progress lines;
- ``probe``     -- does something answer (TCP, AMQP, management API)? Starts nothing;
- ``find``      -- the order of the sources and ``ensure_broker()``, the tests' entry;
- ``container`` -- a throw-away broker in Docker through testcontainers;
- ``debian``    -- start and stop Debian ``rabbitmq-server`` nodes, the system one or
  nodes of one's own (name, port, data/log dirs, config file);
- ``chroot``    -- RabbitMQ 4.0 and 4.3 from newer Debian releases, each in a chroot
  built once, with a single node of its own (``broker.py rmq43 start``);
- ``cluster``, ``partition`` -- a local 3-node cluster, and cutting a node off.

``scripts/broker.py`` is the command line over them.  Only the standard library is
required; pika, docker and testcontainers are used when importable.
"""

from __future__ import annotations

from .base import BrokerInfo, BrokerUnavailable, SecretUrl, mask_url
from .find import ensure_broker, plan

__all__ = ["BrokerInfo", "BrokerUnavailable", "SecretUrl", "ensure_broker", "mask_url", "plan"]
