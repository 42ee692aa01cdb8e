"""The worker's deliveries on aiormq, each handed over as its frames are read, without a
task of aiormq's per delivery (:func:`deliver_at_once`). It reaches into the channel's
private reader; where that is not there, or ``RMQDELAY_CLIENT_FAST=0``, aiormq's own
task calls the consumer, the same outcome.
"""

from __future__ import annotations

import logging
from typing import Any

from ..publishing import client_fast

__all__ = ["AT_ONCE", "deliver_at_once"]

_consumer_log = logging.getLogger("rmqdelay.worker")

AT_ONCE = "rmqdelay_at_once"
"""The attribute of a consumer callback naming its plain-function twin (see
:func:`deliver_at_once`)."""


def deliver_at_once(underlay: Any) -> bool:
    """Hand each delivery to its consumer as the frames are read, on this channel, for a
    consumer callback that carries a plain-function twin under :data:`AT_ONCE`.

    aiormq starts a task per delivery to run the consumer's coroutine (a task, a wrapper,
    an entry in the channel's future store, two done callbacks: a tenth of the worker's
    client CPU per message). The worker's callback only hands the delivery to a task of
    its own, which must outlive a closing channel anyway; its twin does that without
    aiormq's task. Any other consumer goes through aiormq's ``_on_deliver_frame`` as
    before. False where this aiormq lacks what that needs (or ``RMQDELAY_CLIENT_FAST=0``):
    aiormq's task then calls the coroutine, the same outcome. aiormq 6.8 and 6.9 read
    the method once, when the channel opens: there the coroutine is called too.
    """
    original: Any = getattr(underlay, "_on_deliver_frame", None)
    if getattr(original, "rmqdelay", False):
        return True
    get_header: Any = getattr(underlay, "_Channel__get_content_header", None)
    read_content: Any = getattr(underlay, "_read_content", None)
    consumers = getattr(underlay, "consumers", None)
    if (
        not client_fast()
        or not all(callable(f) for f in (original, get_header, read_content))
        or not isinstance(consumers, dict)
    ):
        return False

    async def on_deliver_frame(frame: Any) -> None:
        consumer = underlay.consumers.get(frame.consumer_tag)
        at_once = getattr(consumer, AT_ONCE, None)
        if at_once is None:
            await original(frame)
            return
        header = await get_header()
        message = await read_content(frame, header)
        try:
            at_once(message)
        except Exception:  # as aiormq logs a failed consumer: never stop the reader
            _consumer_log.exception("consumer callback failed")

    on_deliver_frame.rmqdelay = True  # type: ignore[attr-defined]
    underlay._on_deliver_frame = on_deliver_frame
    return True
