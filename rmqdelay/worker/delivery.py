"""What the worker reads off a delivery before any hook or handler sees it."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from aio_pika.abc import AbstractIncomingMessage

from ..core.clock import datetime_of_ms, now_ms, timedelta_of_ms
from ..core.messages import ATTEMPT, DUE_AT, header_int

__all__ = ["Delivery", "read_delivery"]


@dataclass(frozen=True)
class Delivery:
    """A delivery as hooks see it: read once, in Unix ms as the wire carries it."""

    destination: str
    message_id: str
    """The same across retries and replays (one is made up for a message without)."""
    attempt: int
    due_ms: int | None
    """When it was due (``rmqdelay-due-at``); None for a message rmqdelay did not publish."""
    received_ms: int
    headers: Mapping[str, Any]
    redelivered: bool

    @property
    def due_at(self) -> datetime | None:
        return None if self.due_ms is None else datetime_of_ms(self.due_ms)

    @property
    def lateness_ms(self) -> int | None:
        """How long after its due time the worker received it."""
        return None if self.due_ms is None else self.received_ms - self.due_ms

    @property
    def lateness(self) -> timedelta | None:
        late = self.lateness_ms
        return None if late is None else timedelta_of_ms(late)

    @property
    def fields(self) -> dict[str, Any]:
        """The ``extra`` of its log lines."""
        return {
            "destination": self.destination,
            "message_id": self.message_id,
            "attempt": self.attempt,
            "lateness_ms": self.lateness_ms,
        }


def read_delivery(message: AbstractIncomingMessage, destination: str) -> Delivery:
    headers = dict(message.headers or {})
    due_ms = header_int(headers, DUE_AT, -1)
    return Delivery(
        destination=destination,
        # A message without an id gets one here, which its retries then keep.
        message_id=message.message_id or str(uuid.uuid4()),
        attempt=max(1, header_int(headers, ATTEMPT, 1)),
        due_ms=due_ms if due_ms >= 0 else None,
        received_ms=now_ms(),
        headers=headers,
        redelivered=bool(message.redelivered),
    )
