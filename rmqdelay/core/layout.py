"""The delay layout: which positions exist, their digits, and every tier's TTL.

A position is one word of the routing key. Positional ones are the digits of the
delay in the radix, most significant first; named tiers sit above them as
positions with the single digit 1, so a common delay such as 15 minutes is one hop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ..errors import ConfigurationError
from .durations import format_ms

MAX_TTL_MS = 10 * 365 * 24 * 3600 * 1000
"""RabbitMQ refuses a TTL over ten years (3.11 and later)."""

__all__ = [
    "DEFAULT_JOURNAL_RETENTION",
    "DIGITS",
    "Layout",
    "Position",
    "Tier",
    "parse_size",
    "segment_bytes",
]

DIGITS = "0123456789abcdef"
DEFAULT_MAX_DELAY_MS = 366 * 24 * 3600 * 1000
_WORK_INFIX = ".work."
_HELD_INFIX = ".held."
DEFAULT_JOURNAL_RETENTION = 2 * 1024**3
"""The journal's and its checkpoints' streams each keep this many bytes (2 GiB)."""
HOLD_WINDOW_MS = 6000
"""The default hold window is the largest one not over this: 5.12 s for the default layout
(radix 16 at 10 ms), so the seconds-long delays of retries skip every tier. A held message
waits at most that long in a consumer."""
MIN_JOURNAL_RETENTION = 64 * 1024**2
"""Less could not hold a checkpoint and the tail after it at any useful scale."""
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?b|b)?\s*", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def parse_size(value: object) -> int:
    """A size in bytes, given as an int or as ``"2GiB"``, ``"500MB"``, ``"1.5GB"``."""
    if isinstance(value, bool):
        raise ConfigurationError(f"a size in bytes, such as '2GiB' or '500MB', not {value!r}")
    if isinstance(value, int):
        size = value
    else:
        match = _SIZE.fullmatch(value) if isinstance(value, str) else None
        if match is None:
            raise ConfigurationError(f"a size in bytes, such as '2GiB' or '500MB', not {value!r}")
        size = int(float(match[1]) * _UNITS[(match[2] or "").lower()])
    if size < MIN_JOURNAL_RETENTION:
        raise ConfigurationError(
            f"journal_retention {size:,} bytes is under the least useful, "
            f"{MIN_JOURNAL_RETENTION // 1024**2} MiB: it must hold the latest checkpoint "
            "and the journal after it"
        )
    return size


def segment_bytes(retention: int) -> int:
    """A stream segment's size for a retention: an eighth of it, from 16 MiB to 500 MB
    (RabbitMQ's own), so retention deletes old records in small steps."""
    return max(16 * 1024**2, min(500_000_000, retention // 8))


@dataclass(frozen=True)
class Tier:
    """One tier queue: a position and a nonzero digit, with its fixed TTL.

    A fanout exchange of the same name leads to it and nowhere else: publishers send
    there, so entering the tiers costs no topic lookup (exchanges and queues have
    separate names in RabbitMQ).
    """

    index: int  # the position's word index in the routing key, 0 = leftmost
    digit: int
    units: int
    ttl_ms: int
    queue: str


@dataclass(frozen=True)
class Position:
    """One word of the routing key, and the tier queues of its nonzero digits."""

    index: int
    label: str  # "p3" for radix power 3, or "named.15m"
    weight: int  # units per digit step
    max_digit: int
    exchange: str  # the exchange its tiers dead-letter into
    tiers: tuple[Tier, ...]


@dataclass(frozen=True)
class Layout:
    """Everything derived from the settings that planning and topology need. Pure."""

    prefix: str
    resolution_ms: int
    radix: int
    positions: tuple[Position, ...]
    positional_count: int
    max_delay_ms: int
    max_destination_length: int
    queue_type: Literal["quorum", "classic"] = "quorum"
    delivery_limit: int = 20
    journal: bool = True
    """Whether the schedule journal (a stream, :mod:`rmqdelay.core.journal`) is kept."""
    journal_retention: int = DEFAULT_JOURNAL_RETENTION
    """Bytes the journal's stream keeps, and its checkpoints' (``x-max-length-bytes``)."""
    leader_locator: str | None = "balanced"
    """``x-queue-leader-locator`` of quorum queues; None declares none."""
    quorum_group_size: int | None = None
    hold_units: int = 1
    """The hold window in units, a power of the radix times a divisor of it: a held
    destination's messages skip the digits below it and arrive up to that early; its
    consumer waits out the rest."""

    @property
    def hold_ms(self) -> int:
        return self.hold_units * self.resolution_ms

    def held_marker(self, destination: str) -> str:
        """The exchange whose existence says ``destination`` is held by rmqdelay's
        consumers (``topology apply --held``): publishers check it once, passively."""
        return f"{self.prefix}{_HELD_INFIX}{destination}"

    def held_of(self, exchange: str) -> str | None:
        """The destination whose held marker ``exchange`` is, or None."""
        head = f"{self.prefix}{_HELD_INFIX}"
        return exchange[len(head) :] or None if exchange.startswith(head) else None

    @property
    def named(self) -> tuple[Position, ...]:
        return self.positions[: len(self.positions) - self.positional_count]

    @property
    def tiers(self) -> tuple[Tier, ...]:
        return tuple(t for p in self.positions for t in p.tiers)

    @property
    def capacity_units(self) -> int:
        """The most units the positional digits can write."""
        top = self.positions[len(self.positions) - self.positional_count]
        return top.max_digit * top.weight + top.weight - 1

    @property
    def delivery_exchange(self) -> str:
        return f"{self.prefix}.delivery"

    @property
    def parking(self) -> str:
        """The parking queue, and the fanout exchange of the same name leading to it."""
        return f"{self.prefix}.parking"

    def work_queue(self, destination: str) -> str:
        return f"{self.prefix}{_WORK_INFIX}{destination}"

    def destination_of(self, work_queue: str) -> str | None:
        head = f"{self.prefix}{_WORK_INFIX}"
        return work_queue[len(head) :] if work_queue.startswith(head) else None

    @classmethod
    def build(
        cls,
        *,
        prefix: str = "rmqdelay",
        resolution_ms: int = 10,
        radix: int = 16,
        positions: int | None = None,
        max_delay_ms: int | None = None,
        named_tiers_ms: tuple[int, ...] = (),
        max_destination_length: int = 100,
        queue_type: Literal["quorum", "classic"] = "quorum",
        delivery_limit: int = 20,
        journal: bool = True,
        journal_retention: int = DEFAULT_JOURNAL_RETENTION,
        leader_locator: str | None = "balanced",
        quorum_group_size: int | None = None,
        hold_window_ms: int | None = None,
    ) -> Layout:
        """Derive the positions and check every limit that needs more than one value.

        ``named_tiers_ms`` come longest first. :attr:`rmqdelay.Settings.layout` calls this.
        """
        r, b = resolution_ms, radix
        for named in named_tiers_ms:
            if named <= 0 or named % r:
                raise ConfigurationError(
                    f"named tier {format_ms(named)} must be a positive multiple of the "
                    f"resolution {format_ms(r)}"
                )
        if positions is not None:
            count = positions
            if count < 1:
                raise ConfigurationError(f"positions must be at least 1, got {count}")
            capacity_ms = (b**count - 1) * r
            max_delay = max_delay_ms if max_delay_ms is not None else capacity_ms
            if max_delay > capacity_ms:
                raise ConfigurationError(
                    f"max_delay {format_ms(max_delay)} needs more than positions={count}, "
                    f"which reach {format_ms(capacity_ms)}; raise positions or drop one"
                )
        else:
            max_delay = max_delay_ms if max_delay_ms is not None else DEFAULT_MAX_DELAY_MS
            if max_delay <= 0:
                raise ConfigurationError(f"max_delay must be positive, got {max_delay}ms")
            units, count = -(-max_delay // r), 1
            while b**count - 1 < units:
                count += 1
        # The top position gets only the digits max_delay can reach: no tier that no
        # delay uses, and no TTL past RabbitMQ's cap for a coarse resolution.
        top_digit = min(b - 1, -(-max_delay // r) // b ** (count - 1))
        top_ttl = top_digit * b ** (count - 1) * r
        for ttl, what in [
            (top_ttl, f"the top tier of radix {b}"),
            *((n, f"named tier {format_ms(n)}") for n in named_tiers_ms),
        ]:
            if ttl > MAX_TTL_MS:
                raise ConfigurationError(
                    f"{what} needs a TTL of {format_ms(ttl)}, over RabbitMQ's 10-year cap; "
                    "lower max_delay, positions or the resolution"
                )
        words = len(named_tiers_ms) + count
        key_bytes = 2 * words + max_destination_length
        if key_bytes > 255:
            raise ConfigurationError(
                f"a routing key could take {key_bytes} bytes ({words} position words and a "
                f"destination of up to {max_destination_length}), over AMQP's 255; "
                "lower max_destination_length or max_delay, or raise the radix"
            )
        hold_units = _hold_units(r, b, count, hold_window_ms)
        longest_queue = len(prefix) + len(_WORK_INFIX) + max_destination_length
        if longest_queue > 255:
            raise ConfigurationError(
                f"a work queue name could take {longest_queue} bytes, over 255: shorten "
                "the prefix or lower max_destination_length"
            )

        built: list[Position] = []
        for index, named in enumerate(named_tiers_ms):
            label = f"named.{format_ms(named)}"
            built.append(_position(prefix, index, label, named // r, 1, r))
        for power in range(count - 1, -1, -1):
            index, top = len(built), top_digit if power == count - 1 else b - 1
            built.append(_position(prefix, index, f"p{power}", b**power, top, r))
        return cls(
            prefix=prefix,
            resolution_ms=r,
            radix=b,
            positions=tuple(built),
            positional_count=count,
            max_delay_ms=max_delay,
            max_destination_length=max_destination_length,
            queue_type=queue_type,
            delivery_limit=delivery_limit,
            journal=journal,
            journal_retention=parse_size(journal_retention),
            leader_locator=leader_locator,
            quorum_group_size=quorum_group_size,
            hold_units=hold_units,
        )


def _hold_units(r: int, b: int, count: int, window_ms: int | None) -> int:
    """The hold window in units: ``window_ms`` when it is a digit boundary times a divisor
    of the radix (``m x b**k`` units under the top position: a held plan's digits below
    ``k`` are 0, and rounding down to ``m`` never borrows, so no plan takes more hops than
    at ``b**k``), else the default's rule."""
    windows: list[int] = sorted({m * b**k for k in range(count) for m in range(1, b) if b % m == 0})
    if window_ms is None:
        return max(u for u in windows if u * r <= HOLD_WINDOW_MS or u == 1)
    if window_ms % r or window_ms // r not in windows:
        below = [u for u in windows if u * r < window_ms][-1:]
        above = [u for u in windows if u * r > window_ms][:1]
        shown = " or ".join(format_ms(u * r) for u in below + above)
        raise ConfigurationError(
            f"hold_window {format_ms(window_ms)} must be the resolution times radix**k "
            f"times a divisor of the radix: the nearest are {shown}"
        )
    return int(window_ms // r)


def _position(prefix: str, index: int, label: str, weight: int, max_digit: int, r: int) -> Position:
    named = max_digit == 1 and label.startswith("named.")
    tiers = tuple(
        Tier(
            index=index,
            digit=digit,
            units=digit * weight,
            ttl_ms=digit * weight * r,
            queue=(
                f"{prefix}.tier.{label}"
                if named
                else f"{prefix}.tier.{label}.{DIGITS[digit]}-{format_ms(digit * weight * r)}"
            ),
        )
        for digit in range(1, max_digit + 1)
    )
    return Position(index, label, weight, max_digit, f"{prefix}.hop.{label}", tiers)
