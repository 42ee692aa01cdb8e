"""Handling a delivery in a worker, pure: what the worker asks before and after a handler.

``handlers`` reads a handler's signature and decodes a body the way it asks; ``retry``
decides what follows its outcome (ack, retry later, requeue, park) and ``parking`` writes
and reads a parked message's headers; ``acks`` says which deliveries may be acked, and
how; ``takeback`` keeps the handlings the broker took back while they ran. The worker
(``rmqdelay.worker``) carries the decisions out.
"""
