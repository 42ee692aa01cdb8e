"""Publishing, sans-IO: the publisher API declared once, and the flows under it.

- :mod:`.aio_api` declares every operation and option (:mod:`.api`, its sync twin, is
  generated from it); every publisher, on a broker or in memory, implements it.
- :mod:`.publisher`: :class:`~.publisher.PublisherCore`, each operation as a flow;
  :mod:`.prepare` checks a message, :mod:`.sending` sends a batch and plans its routes.
- :mod:`.outgoing`: a message through its stages and the results; :mod:`.templates`:
  the encoded properties, made fast.
"""
