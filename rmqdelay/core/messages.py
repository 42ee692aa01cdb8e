"""Message bodies and headers, independent of any client library."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from ..errors import InvalidBodyError

__all__ = [
    "ATTEMPT",
    "DESTINATION",
    "DUE_AT",
    "Body",
    "clean_headers",
    "encode_body",
]

DUE_AT = "rmqdelay-due-at"
DESTINATION = "rmqdelay-destination"
ATTEMPT = "rmqdelay-attempt"
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
BINARY = "application/octet-stream"

Body = bytes | bytearray | memoryview | str | Mapping[str, Any] | list[Any] | BaseModel
"""What ``publish`` takes: bytes, text, a JSON dict or list, or a pydantic model."""

_DEATH_PREFIXES = ("x-first-death-", "x-last-death-")


def encode_body(body: object) -> tuple[bytes, str]:
    """Serialize a body; return the bytes and their content type."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body), BINARY
    if isinstance(body, str):
        return body.encode(), TEXT
    if isinstance(body, BaseModel):
        return body.model_dump_json().encode(), JSON
    if isinstance(body, (Mapping, list, tuple)):
        try:
            text = json.dumps(body, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise InvalidBodyError(f"body cannot be serialized as JSON: {exc}") from None
        return text.encode(), JSON
    if isinstance(body, float) and not math.isfinite(body):
        raise InvalidBodyError(f"body cannot be serialized as JSON: {body!r}")
    raise InvalidBodyError(
        f"cannot serialize a body of type {type(body).__name__}: pass bytes, str, "
        "a dict or list (sent as JSON) or a pydantic model"
    )


def clean_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Copy headers without the broker's dead-letter records.

    Before RabbitMQ 4.0.1 a message that dead-letters through a queue already in its
    ``x-death`` with no rejection in between is dropped silently, so a message that
    goes round the tiers again must not carry them.
    """
    if not headers:
        return {}
    return {
        k: v for k, v in headers.items() if k != "x-death" and not k.startswith(_DEATH_PREFIXES)
    }
