"""A second implementation of docs/protocol.md, written from that page alone.

It imports nothing from rmqdelay, on purpose: it stands for a port in another language.
tests/unit/test_protocol_vectors.py checks it on the vectors (and against the core on
random layouts), and tests/broker/test_protocol_raw.py publishes with it through plain
pika. Where it had to guess, the page is missing something.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PortError",
    "PortLayout",
    "due_ms",
    "fmt",
    "headers",
    "journal_line",
    "layout_from_queues",
]

_DESTINATION = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")
_HEX = "0123456789abcdef"
_PARTS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1))


class PortError(ValueError):
    """A publish the protocol refuses: ``str()`` is the vectors' ``error``."""


def fmt(ms: int) -> str:
    """§1: days, hours, minutes, seconds, ms; each part only when not zero."""
    if ms == 0:
        return "0ms"
    out, rest = [], ms
    for unit, size in _PARTS:
        count, rest = divmod(rest, size)
        if count:
            out.append(f"{count}{unit}")
    return "".join(out)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def due_ms(now_us: int, delay_us: int) -> int:
    """§4: Unix ms, rounded up; a due time already past is due now."""
    return _ceil_div(now_us + max(0, delay_us), 1000)


@dataclass(frozen=True)
class PortLayout:
    """§1, from the settings."""

    prefix: str = "rmqdelay"
    resolution_ms: int = 10
    radix: int = 16
    max_delay_ms: int | None = 366 * 86_400_000
    positions: int | None = None
    named_tiers_ms: tuple[int, ...] = ()
    max_destination_length: int = 100

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> PortLayout:
        values = dict(settings)
        values["named_tiers_ms"] = tuple(values.get("named_tiers_ms", ()))
        return cls(**values)

    @property
    def r(self) -> int:
        return self.resolution_ms

    @property
    def max_delay(self) -> int:
        if self.max_delay_ms is not None:
            return self.max_delay_ms
        assert self.positions is not None
        return int(self.radix**self.positions - 1) * self.r

    @property
    def p(self) -> int:
        if self.positions is not None:
            return self.positions
        units, count = _ceil_div(self.max_delay, self.r), 1
        while self.radix**count - 1 < units:
            count += 1
        return count

    @property
    def top(self) -> int:
        return min(
            self.radix - 1, _ceil_div(self.max_delay, self.r) // int(self.radix ** (self.p - 1))
        )

    @property
    def hold_ms(self) -> int:
        """§10: the largest `r * m * b^k` (k < P, m divides b) not over 6,000 ms; at least
        one unit."""
        units = 1
        for k in range(self.p):
            for m in range(1, self.radix):
                if self.radix % m == 0 and self.r * m * self.radix**k <= 6_000:
                    units = max(units, m * self.radix**k)
        return units * self.r

    @property
    def capacity(self) -> int:
        weight = int(self.radix ** (self.p - 1))
        return self.top * weight + weight - 1

    @property
    def words(self) -> list[dict[str, Any]]:
        """Every position in word order: label, weight, max_digit, hop exchange, tiers."""
        out = []
        for named in self.named_tiers_ms:
            label = f"named.{fmt(named)}"
            tier = {"digit": 1, "queue": f"{self.prefix}.tier.{label}", "ttl_ms": named}
            out.append(self._word(label, named // self.r, 1, [tier]))
        for k in range(self.p - 1, -1, -1):
            weight = self.radix**k
            top = self.top if k == self.p - 1 else self.radix - 1
            tiers = [
                {
                    "digit": v,
                    "queue": f"{self.prefix}.tier.p{k}.{_HEX[v]}-{fmt(v * weight * self.r)}",
                    "ttl_ms": v * weight * self.r,
                }
                for v in range(1, top + 1)
            ]
            out.append(self._word(f"p{k}", weight, top, tiers))
        return out

    def _word(
        self, label: str, weight: int, top: int, tiers: list[dict[str, Any]]
    ) -> dict[str, Any]:
        hop = f"{self.prefix}.hop.{label}"
        return {
            "label": label,
            "weight": weight,
            "max_digit": top,
            "hop_exchange": hop,
            "tiers": tiers,
        }

    def work_queue(self, destination: str) -> str:
        return f"{self.prefix}.work.{destination}"

    def _base(self, rest: int) -> list[int]:
        digits = []
        for k in range(self.p - 1, -1, -1):
            digit, rest = divmod(rest, self.radix**k)
            digits.append(digit)
        return digits

    def digits(self, units: int) -> list[int]:
        """§2 step 3."""
        named = self.named_tiers_ms
        best: tuple[tuple[int, int], list[int]] | None = None
        for mask in range(2 ** len(named)):
            used = [(mask >> i) & 1 for i in range(len(named))]
            rest = units - sum(u * t // self.r for u, t in zip(used, named, strict=True))
            if not 0 <= rest <= self.capacity:
                continue
            digits = used + self._base(rest)
            cost = (sum(1 for d in digits if d), sum(used))
            if best is None or cost < best[0]:  # strictly fewer: the lowest mask wins ties
                best = (cost, digits)
        assert best is not None, f"{units} units fit no candidate"
        return best[1]

    def plan(self, delay_us: int, destination: str, *, held: bool = False) -> dict[str, Any]:
        """§2 and §3 (and §10 for a ``held`` destination): what to publish, as the
        vectors write a case."""
        too_long = len(destination.encode()) > self.max_destination_length
        if too_long or not _DESTINATION.fullmatch(destination):
            raise PortError("invalid destination")
        if delay_us > self.max_delay * 1000:
            raise PortError("over max_delay")
        units = max(0, _ceil_div(delay_us, self.r * 1000))
        if held:  # §10: down to a multiple of the hold window
            window = self.hold_ms // self.r
            units = max(0, delay_us // (self.hold_ms * 1000)) * window
        digits = self.digits(units)
        key = ".".join([*(_HEX[d] for d in digits), destination])
        hops = [
            {
                "queue": word["tiers"][d - 1]["queue"],
                "ttl_ms": word["tiers"][d - 1]["ttl_ms"],
                "dead_letter_exchange": word["hop_exchange"],
            }
            for word, d in zip(self.words, digits, strict=True)
            if d
        ]
        if hops:
            exchange, publish_key = hops[0]["queue"], key
        else:
            exchange, publish_key = "", self.work_queue(destination)
        return {
            "units": units,
            "digits": digits,
            "routing_key": key,
            "exchange": exchange,
            "publish_key": publish_key,
            "hops": hops,
            "work_queue": self.work_queue(destination),
        }


def headers(due: int, destination: str) -> dict[str, Any]:
    """§4's three headers."""
    return {"rmqdelay-attempt": 1, "rmqdelay-due-at": due, "rmqdelay-destination": destination}


def journal_line(
    message_id: str, destination: str, due: int, body_size: int, recorded_ms: int
) -> bytes:
    """§6: one ``scheduled`` record."""
    record = {
        "v": 1,
        "k": "scheduled",
        "id": message_id,
        "d": destination,
        "due": due,
        "a": 1,
        "n": body_size,
        "t": recorded_ms,
    }
    return json.dumps(record, separators=(",", ":")).encode()


def layout_from_queues(prefix: str, queues: Iterable[tuple[str, int]]) -> dict[str, Any]:
    """§1, reading the layout from the broker: tier queue names and their TTLs in, the
    resolution, radix, positions, top digit and named tiers out (max_delay is not there)."""
    head = f"{prefix}.tier."
    named: list[int] = []
    by_power: dict[int, list[int]] = {}
    for name, ttl in queues:
        if not name.startswith(head):
            continue
        label = name[len(head) :]
        if label.startswith("named."):
            named.append(ttl)
        else:
            power = int(label.split(".", 1)[0][1:])
            by_power.setdefault(power, []).append(ttl)
    count = len(by_power)
    return {
        "resolution_ms": min(by_power[0]),
        "radix": len(by_power[0]) + 1,
        "positions": count,
        "top": len(by_power[count - 1]),
        "named_tiers_ms": sorted(named, reverse=True),
    }
