"""Every reach into aiormq's private state, in one package, and the checks that guard
them: the async publisher's windows (:mod:`.window`), the worker's deliveries without a
task of aiormq's each (:mod:`.deliveries`), and its acks made when aiormq's writer takes
them (:mod:`.made_late`).

None of that is aiormq's public API, so it is checked here: when this package is
imported (the aiormq version inside the bounds pyproject.toml declares, what the classes
show) and on each channel before use (:func:`can_write_frames`,
:func:`can_queue_made_late`). When a check fails, or ``RMQDELAY_CLIENT_FAST=0`` asks for
it, each message goes through the public ``basic_publish`` and each ack through
``basic_ack`` instead: slower, the same outcomes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from importlib import metadata
from typing import Any

import aiormq
from aiormq.abc import ChannelFrame

from ..publishing import client_fast
from .deliveries import AT_ONCE, deliver_at_once
from .made_late import queue_made_late
from .window import DROPPED, Confirms, write_window

__all__ = [
    "AIORMQ_BOUNDS",
    "AT_ONCE",
    "DROPPED",
    "LATE_PROBLEM",
    "PROBLEM",
    "Confirms",
    "can_queue_made_late",
    "can_write_frames",
    "deliver_at_once",
    "queue_made_late",
    "self_check",
    "write_window",
]

log = logging.getLogger("rmqdelay.publisher")

AIORMQ_BOUNDS = ((6, 8), (8,))
"""The aiormq versions whose books this package knows: >= 6.8, < 8 (as pyproject.toml)."""

_BOOKS = (
    "confirmations",
    "message_id_delivery_tag",
    "delivery_tag",
    "write_queue",
    "lock",
    "is_closed",
)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def _frame_lacks(frame: type, *names: str) -> str:
    """Which of ``names`` aiormq's frame class lacks as fields: empty when none."""
    if not dataclasses.is_dataclass(frame):
        return "aiormq.abc.ChannelFrame is no longer a dataclass"
    fields = {field.name for field in dataclasses.fields(frame)}
    missing = [name for name in names if name not in fields]
    return f"aiormq.abc.ChannelFrame has no {', '.join(missing)}" if missing else ""


def self_check(version: str, channel: type = aiormq.Channel, frame: type = ChannelFrame) -> str:
    """What stops :func:`write_window` on this aiormq: empty when nothing does.

    The books themselves are set in ``Channel.__init__``: :func:`can_write_frames` checks
    them on each channel; this checks what the classes show.
    """
    low, high = AIORMQ_BOUNDS
    if not low <= _version(version) < high:
        return f"aiormq {version} is outside the versions rmqdelay knows (>= 6.8, < 8)"
    for name in (
        "basic_publish",
        "create_future",
        "_confirm_delivery",
        "_on_confirm_frame",
        "_on_return_frame",
    ):
        if not callable(getattr(channel, name, None)):
            return f"aiormq.Channel has no {name}()"
    return _frame_lacks(frame, "payload", "should_close")


PROBLEM = self_check(metadata.version("aiormq"))
"""Why :func:`write_window` is off for this process, or empty."""
if PROBLEM:
    log.warning("%s: publishing message by message through basic_publish", PROBLEM)

_warned: set[str] = set()


def _books_problem(underlay: Any) -> str:
    missing = [name for name in _BOOKS if not hasattr(underlay, name)]
    if missing:
        return f"aiormq {metadata.version('aiormq')}'s channel has no {', '.join(missing)}"
    kinds = (
        (underlay.confirmations, dict),
        (underlay.message_id_delivery_tag, dict),
        (underlay.delivery_tag, int),
        (getattr(underlay, "number", None), int),
        (getattr(getattr(underlay.connection, "connection_tune", None), "frame_max", None), int),
    )
    if not all(isinstance(value, kind) for value, kind in kinds):
        return f"aiormq {metadata.version('aiormq')}'s channel keeps other books"
    return ""


def can_write_frames(underlay: Any) -> bool:
    """Whether :func:`write_window` may run on this channel (a confirm channel whose
    books look as expected); otherwise each message goes through ``basic_publish``."""
    if PROBLEM or not client_fast() or not getattr(underlay, "publisher_confirms", False):
        return False
    problem = _books_problem(underlay)
    if problem and problem not in _warned:
        _warned.add(problem)
        log.warning("%s: publishing message by message through basic_publish", problem)
    return not problem


def _frame_problem(frame: type = ChannelFrame) -> str:
    """What stops :func:`queue_made_late` on this aiormq: empty when nothing does."""
    problem = _frame_lacks(frame, "payload", "should_close", "drain_future")
    if not problem and (
        not callable(getattr(frame, "drain", None))
        or not isinstance(getattr(frame, "should_drain", None), property)
    ):
        problem = "aiormq.abc.ChannelFrame has no drain() or should_drain"
    return problem


LATE_PROBLEM = _frame_problem()
"""Why :func:`queue_made_late` is off for this process, or empty."""


def can_queue_made_late(underlay: Any) -> bool:
    """Whether :func:`queue_made_late` may run on this channel; otherwise the worker acks
    through ``basic_ack``."""
    if LATE_PROBLEM or not client_fast():
        return False
    return (
        isinstance(getattr(underlay, "write_queue", None), asyncio.Queue)
        and isinstance(getattr(underlay, "number", None), int)
        and callable(getattr(underlay, "create_future", None))
        and hasattr(underlay, "is_closed")
    )
