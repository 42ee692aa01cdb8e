"""The reconnect policy: how long to pause, and which failures are worth a retry."""

from __future__ import annotations

import asyncio

import aiormq

from ..errors import ConnectionFailedError, WorkerError

__all__ = [
    "RECONNECT_FIRST_S",
    "RECONNECT_MAX_S",
    "RETRIED",
    "reconnect_delay",
    "refused",
    "why_retry",
]

RECONNECT_FIRST_S = 0.5
"""The pause before the first reconnect, before jitter; it doubles with each failure."""
RECONNECT_MAX_S = 15.0
"""No reconnect pause is longer, jitter included (the README promises it)."""
_RECONNECT_DOUBLINGS = 16
"""Doublings past which the cap always wins: keeps ``2**failures`` a small float."""
RETRIED = (ConnectionFailedError, aiormq.exceptions.AMQPError, OSError, asyncio.TimeoutError)
"""What may fail a start and pass; :func:`why_retry` sorts out those that will not."""


def reconnect_delay(failures: int, jitter: float) -> float:
    """The pause, in seconds, before the next connect; *failures* counts the failed
    connects in a row before the one that just failed (0 after the first).

    :data:`RECONNECT_FIRST_S` doubling each time, scaled by ``0.5 + jitter`` (*jitter*
    in [0, 1), so that many workers cut off together do not come back together), then
    capped: the cap comes after the jitter, so no pause exceeds :data:`RECONNECT_MAX_S`.
    """
    base = RECONNECT_FIRST_S * 2.0 ** min(failures, _RECONNECT_DOUBLINGS)
    return min(RECONNECT_MAX_S, base * (0.5 + jitter))


def why_retry(exc: BaseException, masked_url: str) -> str:
    """What to log before retrying a failed start; raises the WorkerError that stops the
    worker instead when only a change fixes it (a refusal, a wrong password...)."""
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
        raise refused(exc) from None  # a permission to grant: retrying won't help
    if isinstance(exc, ConnectionFailedError):
        if not exc.transient:
            raise WorkerError(str(exc)) from None
        return str(exc)
    return f"starting on {masked_url} failed ({type(exc).__name__} {exc})"


def refused(
    exc: aiormq.exceptions.ChannelAccessRefused, queue: str | None = None, permission: str = ""
) -> WorkerError:
    """A refusal (403) as a permanent startup error naming the queue and the permission."""
    detail = str(exc.args[-1] if exc.args else exc)
    if queue is None:
        return WorkerError(
            f"the broker refused the worker's user: {detail}; grant it read permission on "
            "the work queues and the schedule stream, and write permission on the prefix's "
            "exchanges"
        )
    return WorkerError(
        f"the worker's user has no {permission} permission on work queue {queue!r}: grant "
        f"it (the {permission} pattern of `rabbitmqctl set_permissions` must match the "
        f"queue's name) ({detail})"
    )
