"""Parked messages: the headers a parked message carries, and reading them back.

Pure. A message parked by the worker keeps its body and headers and gains the
``rmqdelay-parked-*`` headers below. A message parked by the broker (a quorum work
queue's delivery limit, or the delivery exchange's alternate exchange when no work
queue is bound) has none of them: :func:`read_parked` then explains it from
``x-death`` and the rmqdelay headers.
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from .. import clock
from ..layout import Layout
from ..messages import ATTEMPT, DESTINATION, DUE_AT, clean_headers, header_int

__all__ = [
    "PARKED_AT",
    "PARKED_ATTEMPTS",
    "PARKED_DESTINATION",
    "PARKED_ERROR",
    "PARKED_ERROR_TYPE",
    "PARKED_REASON",
    "PARKED_TRACEBACK",
    "REPLAYS",
    "ParkedMessage",
    "parked_headers",
    "read_parked",
    "replay_headers",
    "short_traceback",
]

PARKED_REASON = "rmqdelay-parked-reason"
PARKED_ERROR_TYPE = "rmqdelay-parked-error-type"
PARKED_ERROR = "rmqdelay-parked-error"
PARKED_TRACEBACK = "rmqdelay-parked-traceback"
PARKED_ATTEMPTS = "rmqdelay-parked-attempts"
PARKED_DESTINATION = "rmqdelay-parked-destination"
PARKED_AT = "rmqdelay-parked-at"
REPLAYS = "rmqdelay-replays"
_PARKED_PREFIX = "rmqdelay-parked-"
_BROKER_HEADERS = ("x-delivery-count",)

# The whole header table must fit in one AMQP frame (128 KiB by default): stay small.
_MAX_REASON = 500
_MAX_ERROR = 1000
_MAX_TRACEBACK = 2000


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short_traceback(error: BaseException, limit: int = _MAX_TRACEBACK) -> str:
    """The last frames of a traceback, clipped from the front so the raise site stays."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__, limit=-6))
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def parked_headers(
    original: Mapping[str, Any] | None,
    *,
    reason: str,
    destination: str,
    attempts: int,
    parked_at_ms: int,
    error: BaseException | None = None,
    trace: str | None = None,
) -> dict[str, Any]:
    """The original headers plus why, when and after how many attempts it was parked.

    ``trace`` is the handler's traceback, from :func:`short_traceback`, when it helps.
    """
    headers = {k: v for k, v in (original or {}).items() if not k.startswith(_PARKED_PREFIX)}
    headers.update(
        {
            PARKED_REASON: _clip(reason, _MAX_REASON),
            PARKED_DESTINATION: destination,
            PARKED_ATTEMPTS: attempts,
            PARKED_AT: parked_at_ms,
        }
    )
    if error is not None:
        headers[PARKED_ERROR_TYPE] = f"{type(error).__module__}.{type(error).__qualname__}"
        headers[PARKED_ERROR] = _clip(str(error), _MAX_ERROR)
    if trace:
        headers[PARKED_TRACEBACK] = _clip(trace, _MAX_TRACEBACK)
    return headers


def replay_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Headers for sending a parked message back: attempt 1, no parking or death records."""
    out = {
        k: v
        for k, v in clean_headers(headers).items()
        if not k.startswith(_PARKED_PREFIX)
        and k not in _BROKER_HEADERS
        and k not in (DUE_AT, DESTINATION)
    }
    out[REPLAYS] = header_int(headers or {}, REPLAYS, 0) + 1
    out[ATTEMPT] = 1
    return out


@dataclass(frozen=True)
class ParkedMessage:
    """A parked message as ``parked list`` shows it."""

    message_id: str | None
    destination: str | None
    reason: str
    attempts: int
    parked_at: datetime | None
    error_type: str | None = None
    error: str | None = None
    traceback: str | None = None
    replays: int = 0
    headers: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "headers"}
        data["parked_at"] = self.parked_at.isoformat() if self.parked_at else None
        return data


def _deaths(headers: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    value = headers.get("x-death")
    return [d for d in value if isinstance(d, Mapping)] if isinstance(value, list) else []


def _broker_reason(
    layout: Layout | None, headers: Mapping[str, Any], destination: str | None
) -> tuple[str, datetime | None, str | None]:
    """Why the broker parked a message, when, and the destination it names."""
    deaths = _deaths(headers)
    for death in deaths[:1]:  # the newest: how it got here
        queue = _text(death.get("queue")) or ""
        why = _text(death.get("reason")) or "?"
        found = layout.destination_of(queue) if layout is not None else None
        if found is not None:
            when = death.get("time")
            at = when if isinstance(when, datetime) else None
            if at is not None:
                at = clock.as_utc(at)
            if why == "delivery_limit":
                text = f"delivery limit of work queue {queue!r} reached (requeued too often)"
            else:
                text = f"dead-lettered from work queue {queue!r} ({why})"
            return text, at, destination or found
    if destination is not None:
        return (
            f"unroutable: no work queue was bound for destination {destination!r} when it "
            "was due (alternate exchange)",
            None,
            destination,
        )
    return "parked without rmqdelay headers (unknown origin)", None, None


def read_parked(
    headers: Mapping[str, Any] | None, message_id: str | None, layout: Layout | None = None
) -> ParkedMessage:
    """Explain a message found in the parking queue."""
    headers = dict(headers or {})
    destination = _text(headers.get(PARKED_DESTINATION)) or _text(headers.get(DESTINATION))
    attempts = header_int(headers, PARKED_ATTEMPTS, header_int(headers, ATTEMPT, 1))
    reason = _text(headers.get(PARKED_REASON))
    parked_at: datetime | None = None
    at_ms = header_int(headers, PARKED_AT, -1)
    if at_ms >= 0:
        parked_at = clock.datetime_of_ms(at_ms)
    if reason is None:
        reason, parked_at, destination = _broker_reason(layout, headers, destination)
    return ParkedMessage(
        message_id=message_id,
        destination=destination,
        reason=reason,
        attempts=attempts,
        parked_at=parked_at,
        error_type=_text(headers.get(PARKED_ERROR_TYPE)),
        error=_text(headers.get(PARKED_ERROR)),
        traceback=_text(headers.get(PARKED_TRACEBACK)),
        replays=header_int(headers, REPLAYS, 0),
        headers=headers,
    )
