"""``rmqdelay bridge``: a home for the delayed-message-exchange plugin's publishers.

An optional application, as the dashboard: only the CLI imports it, and it may use every
layer below (core, settings, amqp, worker). ``names`` and ``envelope`` are pure (no I/O);
``declare`` makes its objects on a broker; ``inbox`` (stage 1: the inbox into the tiers)
and ``outbox`` (stage 2: a due message to ``DNAME``) run in ``app``'s :class:`Bridge`.
"""
