"""Routing keys: one digit word per position, most significant first, then the destination.

The count of digit words is fixed, so a delivery binding of ``*`` per position and then
the destination's own words matches exactly one destination.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InvalidDestinationError
from .layout import DIGITS, Layout

__all__ = ["ParsedKey", "build_key", "parse_key", "validate_destination"]

_DESTINATION = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


@dataclass(frozen=True)
class ParsedKey:
    digits: tuple[int, ...]
    destination: str


def validate_destination(layout: Layout, destination: object) -> str:
    """Return the destination if it can be a queue name and key words, else raise."""
    if not isinstance(destination, str):
        raise InvalidDestinationError(
            f"destination must be a str, got {type(destination).__name__}"
        )
    size = len(destination.encode())
    if size > layout.max_destination_length:
        raise InvalidDestinationError(
            f"destination {destination[:40]!r}... is {size} bytes, over "
            f"max_destination_length={layout.max_destination_length}"
        )
    if not _DESTINATION.fullmatch(destination):  # match() would let a final "\n" through
        raise InvalidDestinationError(
            f"destination {destination!r} must be words of letters, digits, '-' or '_' "
            "joined by single dots (no spaces, control characters, '*', '#' or empty words)"
        )
    return destination


def build_key(layout: Layout, digits: tuple[int, ...], destination: str) -> str:
    return ".".join([*(DIGITS[d] for d in digits), destination])


def parse_key(layout: Layout, key: str) -> ParsedKey:
    """Read a key back into digits and destination; raise ValueError if it is not ours."""
    words = key.split(".")
    count = len(layout.positions)
    if len(words) <= count:
        raise ValueError(f"routing key {key!r} has no destination after {count} digit words")
    digits = []
    for position, word in zip(layout.positions, words[:count], strict=True):
        digit = DIGITS.find(word) if len(word) == 1 else -1
        if not 0 <= digit <= position.max_digit:
            raise ValueError(f"routing key {key!r}: {word!r} is no digit of {position.label}")
        digits.append(digit)
    destination = ".".join(words[count:])
    return ParsedKey(tuple(digits), validate_destination(layout, destination))
