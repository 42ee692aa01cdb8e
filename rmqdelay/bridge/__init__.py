"""``rmqdelay bridge``: a home for the delayed-message-exchange plugin's publishers.

Publishers send to an exchange ``NAME`` with an ``x-delay`` header, as they did to the
plugin's; the bridge holds each message in rmqdelay's tiers for its delay, then publishes
it to ``DNAME``, where consumers bind. An optional application, as the dashboard: only the
CLI imports it, and it may use every layer below (core, settings, amqp, worker).

- :mod:`.names`, :mod:`.envelope`: pure (no I/O): the bridge's names and objects; the
  ``x-delay`` header and the envelope a copy carries through the tiers.
- :mod:`.declare`: ``bridge declare`` on a broker, and ``bridge run``'s check for it.
- :mod:`.inbox`: stage 1, the inbox into the tiers (pika).
- :mod:`.outbox`: stage 2, a due copy's original to ``DNAME`` (aio-pika).
- :mod:`.hook`: the worker hook that runs both on each connection (stage 1 in a thread or
  a process of its own).
- :mod:`.app`: :class:`~rmqdelay.bridge.app.Bridge`, the long-lived process.
"""
