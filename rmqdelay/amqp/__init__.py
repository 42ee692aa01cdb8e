"""Everything that talks to a broker: connections, TLS, the management API, the sync (pika)
and async (aio-pika) publishers, the topology manager and the parking queue.

Each adapter is thin: what to send and what a reply means lives in :mod:`rmqdelay.core`.
"""
