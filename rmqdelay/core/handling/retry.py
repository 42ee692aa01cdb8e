"""What to do with a message after its handler ran: ack, retry later, requeue or park.

Pure. The worker asks :func:`decide` for a :class:`Decision` and then carries it out,
so the whole retry policy can be tested without a broker. Delays are whole
milliseconds and jitter only ever adds time: a retry is never earlier than the
backoff says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ...errors import ConfigurationError, RmqDelayError
from .. import clock
from ..durations import DurationLike, format_ms, parse_duration_us

__all__ = [
    "Backoff",
    "Decision",
    "DecodeError",
    "HandlerSignal",
    "Park",
    "Requeue",
    "Retry",
    "RetryPolicy",
    "decide",
    "describe_error",
]


def _ms(value: DurationLike, what: str) -> int:
    """A non-negative duration as whole milliseconds, rounded up (never early)."""
    us = parse_duration_us(value, what=what)
    if us < 0:
        raise ConfigurationError(f"{what} must not be negative, got {value!r}")
    return clock.ms_of_us(us)


# --------------------------------------------------------------------------- signals


class HandlerSignal(Exception):
    """Base of the exceptions a handler raises to choose what happens to its message."""


class Retry(HandlerSignal):
    """Handle the message again later, through the delay tiers, as the next attempt.

    ``delay`` overrides the handler's backoff for this retry. Counts toward
    ``max_attempts``: when they are used up, the message is parked instead.
    """

    def __init__(self, delay: DurationLike | None = None, reason: str = "") -> None:
        self.delay_ms = None if delay is None else _ms(delay, "Retry delay")
        self.reason = reason
        shown = "" if delay is None else f" in {format_ms(self.delay_ms or 0)}"
        super().__init__(f"retry{shown}{': ' + reason if reason else ''}")


class Requeue(HandlerSignal):
    """Put the message back on its work queue at once (``basic.reject``, requeue=True).

    No delay and no attempt counted by rmqdelay. On a quorum work queue the broker
    counts it toward ``x-delivery-limit`` and parks a message that keeps coming back;
    a classic queue has no such limit, so the message comes back until the handler
    stops requeueing it.
    """

    def __init__(self, reason: str = "") -> None:
        self.reason = reason
        super().__init__(f"requeue{': ' + reason if reason else ''}")


class Park(HandlerSignal):
    """Park the message at once: no retry loop. ``reason`` is shown by ``parked list``."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class DecodeError(RmqDelayError):
    """The body cannot be decoded or validated as the handler's parameter type."""


# --------------------------------------------------------------------------- backoff


@dataclass(frozen=True)
class Backoff:
    """How long to wait before attempt ``n + 1`` after attempt ``n`` failed.

    Build one with :meth:`constant`, :meth:`exponential` or :meth:`schedule`.
    ``max_ms`` caps the delay before jitter; ``jitter`` adds up to that fraction on
    top, so retries of many messages spread out but none comes early.
    """

    kind: Literal["constant", "exponential", "schedule"]
    base_ms: int
    factor: float = 1.0
    max_ms: int | None = None
    jitter: float = 0.0
    steps_ms: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.jitter <= 1.0 or math.isnan(self.jitter):
            raise ConfigurationError(f"jitter must be from 0 to 1, got {self.jitter!r}")
        if self.factor < 1.0 or not math.isfinite(self.factor):
            raise ConfigurationError(f"backoff factor must be at least 1, got {self.factor!r}")

    @classmethod
    def constant(cls, delay: DurationLike, *, jitter: float = 0.0) -> Backoff:
        """The same delay before every retry."""
        return cls("constant", _ms(delay, "backoff delay"), jitter=jitter)

    @classmethod
    def exponential(
        cls,
        base: DurationLike,
        *,
        factor: float = 2.0,
        max: DurationLike | None = None,
        jitter: float = 0.0,
    ) -> Backoff:
        """``base``, then ``base * factor``, ``base * factor**2``... capped at ``max``."""
        return cls(
            "exponential",
            _ms(base, "backoff base"),
            factor=float(factor),
            max_ms=None if max is None else _ms(max, "backoff max"),
            jitter=jitter,
        )

    @classmethod
    def schedule(cls, delays: Sequence[DurationLike], *, jitter: float = 0.0) -> Backoff:
        """Explicit delays for the first retries; the last one repeats."""
        steps = tuple(_ms(d, "backoff step") for d in delays)
        if not steps:
            raise ConfigurationError("Backoff.schedule needs at least one delay")
        return cls("schedule", steps[0], jitter=jitter, steps_ms=steps)

    def nominal_ms(self, attempt: int) -> int:
        """The delay after attempt ``attempt`` (1-based) failed, before jitter."""
        n = max(1, attempt)
        if self.kind == "constant":
            delay = self.base_ms
        elif self.kind == "schedule":
            delay = self.steps_ms[min(n, len(self.steps_ms)) - 1]
        else:
            grown = float(self.base_ms)
            for _ in range(n - 1):  # stop growing at the cap, so no float overflows
                if grown >= (self.max_ms if self.max_ms is not None else 1e15):
                    break
                grown *= self.factor
            delay = math.ceil(grown)
        return delay if self.max_ms is None else min(delay, self.max_ms)

    def delay_ms(self, attempt: int, rand: float = 0.0) -> int:
        """The delay after attempt ``attempt`` failed; ``rand`` in [0, 1) picks the jitter."""
        nominal = self.nominal_ms(attempt)
        return nominal + math.floor(nominal * self.jitter * min(max(rand, 0.0), 1.0))

    def longest_ms(self, max_attempts: int) -> int:
        """The longest delay this backoff can ask for within ``max_attempts``."""
        worst = max((self.nominal_ms(n) for n in range(1, max(1, max_attempts))), default=0)
        return worst + math.floor(worst * self.jitter)

    def describe(self) -> str:
        jitter = f", jitter {self.jitter:g}" if self.jitter else ""
        cap = f", max {format_ms(self.max_ms)}" if self.max_ms is not None else ""
        if self.kind == "constant":
            return f"constant {format_ms(self.base_ms)}{jitter}"
        if self.kind == "schedule":
            return f"schedule {', '.join(format_ms(s) for s in self.steps_ms)}{jitter}"
        return f"exponential {format_ms(self.base_ms)} x{self.factor:g}{cap}{jitter}"


DEFAULT_BACKOFF = Backoff.exponential("1s", max="10m", jitter=0.1)
DEFAULT_MAX_ATTEMPTS = 5


# --------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class RetryPolicy:
    """A handler's retry rules.

    ``max_attempts`` counts every call of the handler, the first included. An
    exception that is an instance of ``park_on`` parks at once; one of ``retry_on``
    is retried with the backoff; any other exception parks at once.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: Backoff = DEFAULT_BACKOFF
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    park_on: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigurationError(f"max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if not isinstance(self.backoff, Backoff):
            raise ConfigurationError(
                f"backoff must be a rmqdelay.Backoff, e.g. Backoff.exponential('1s'); "
                f"got {type(self.backoff).__name__}"
            )
        for what, types in (("retry_on", self.retry_on), ("park_on", self.park_on)):
            for tp in types:
                if not (isinstance(tp, type) and issubclass(tp, BaseException)):
                    raise ConfigurationError(f"{what} must hold exception classes, got {tp!r}")


# --------------------------------------------------------------------------- decision

Action = Literal["ack", "retry", "requeue", "park"]


@dataclass(frozen=True)
class Decision:
    """What the worker does next. ``attempt`` is the attempt the message will carry."""

    action: Action
    attempt: int
    delay_ms: int = 0
    reason: str = ""


def describe_error(error: BaseException) -> str:
    """``ValueError: boom``, short enough for a header and a log line."""
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    if len(text) > 1:
        first += " ..."
    name = type(error).__name__
    return f"{name}: {first[:300]}" if first else name


def decide(
    error: BaseException | None, attempt: int, policy: RetryPolicy, rand: float = 0.0
) -> Decision:
    """Map a handler's result to an action.

    ``error`` is None when the handler returned; ``attempt`` is the attempt that just
    ran (1-based); ``rand`` in [0, 1) picks the backoff jitter.
    """
    if error is None:
        return Decision("ack", attempt)
    if isinstance(error, Requeue):
        return Decision("requeue", attempt, reason=error.reason or "the handler asked to requeue")
    if isinstance(error, Park):
        return Decision("park", attempt, reason=error.reason or "the handler asked to park")
    if isinstance(error, DecodeError):
        return Decision("park", attempt, reason=f"undecodable body: {error}")
    if isinstance(error, Retry):
        delay = error.delay_ms
        why = f"Retry({error.reason})" if error.reason else "Retry"
    elif isinstance(error, policy.park_on):
        return Decision("park", attempt, reason=f"{describe_error(error)} (park_on)")
    elif isinstance(error, policy.retry_on):
        delay, why = None, describe_error(error)
    else:
        return Decision(
            "park", attempt, reason=f"{describe_error(error)} (not in the handler's retry_on)"
        )
    if attempt >= policy.max_attempts:
        return Decision(
            "park",
            attempt,
            reason=f"gave up after {attempt} of {policy.max_attempts} attempts: {why}",
        )
    if delay is None:
        delay = policy.backoff.delay_ms(attempt, rand)
    return Decision("retry", attempt + 1, delay_ms=delay, reason=why)
