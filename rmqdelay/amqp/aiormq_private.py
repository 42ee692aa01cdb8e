"""Every reach into aiormq's private state, in one place: the async publisher's windows.

:func:`write_window` sends a window of messages as one write of frames rmqdelay encoded,
with a confirm future per message in the channel's own books (``confirmations``,
``message_id_delivery_tag``, ``delivery_tag``, under its ``lock``, written to the
connection's ``write_queue``), so returns, nacks and a closing channel reach each message
as they reach ``aiormq.Channel.basic_publish``'s own. None of that is aiormq's public API,
so it is checked: when this module is imported (the aiormq version inside the bounds
pyproject.toml declares, what the classes show) and on each channel before use. When a
check fails, or ``RMQDELAY_CLIENT_FAST=0`` asks for it, each message goes through the
public ``basic_publish`` instead: slower, the same outcomes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import re
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import aiormq
from aiormq.abc import ChannelFrame

from ..core.outgoing import Outgoing
from ..core.wire import encode_publish
from .publishing import client_fast

__all__ = ["AIORMQ_BOUNDS", "PROBLEM", "can_write_frames", "self_check", "write_window"]

log = logging.getLogger("rmqdelay.publisher")

AIORMQ_BOUNDS = ((6, 8), (8,))
"""The aiormq versions whose books this module knows: >= 6.8, < 8 (as pyproject.toml)."""

_BOOKS = ("confirmations", "message_id_delivery_tag", "delivery_tag", "write_queue", "lock")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text.split("+")[0])[:3])


def self_check(version: str, channel: type = aiormq.Channel, frame: type = ChannelFrame) -> str:
    """What stops :func:`write_window` on this aiormq: empty when nothing does.

    The books themselves are set in ``Channel.__init__``: :func:`can_write_frames` checks
    them on each channel; this checks what the classes show.
    """
    low, high = AIORMQ_BOUNDS
    if not low <= _version(version) < high:
        return f"aiormq {version} is outside the versions rmqdelay knows (>= 6.8, < 8)"
    for name in ("basic_publish", "create_future"):
        if not callable(getattr(channel, name, None)):
            return f"aiormq.Channel has no {name}()"
    if not dataclasses.is_dataclass(frame):
        return "aiormq.abc.ChannelFrame is no longer a dataclass"
    fields = {field.name for field in dataclasses.fields(frame)}
    if not {"payload", "should_close"} <= fields:
        return "aiormq.abc.ChannelFrame has no payload or should_close"
    return ""


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


def _forget(underlay: Any, message_id: str, tag: int, _future: object) -> None:
    if underlay.message_id_delivery_tag.get(message_id) == tag:
        del underlay.message_id_delivery_tag[message_id]


async def write_window(underlay: Any, outs: Sequence[Outgoing]) -> list[asyncio.Future[Any]]:
    """Register a confirm future per message and write all their frames at once, under
    the channel's lock, as ``aiormq.Channel.basic_publish`` does for one.

    aiormq spends, per publish, a lock, a timeout scope, a frame object each and a
    write: on the publish path that was most of the client's time (bench/README.md).
    """
    frame_max = underlay.connection.connection_tune.frame_max
    async with underlay.lock:
        first = underlay.delivery_tag + 1
        payload = b"".join(
            [
                encode_publish(
                    underlay.number,
                    out.exchange,
                    out.routing_key,
                    out.prepared.encoded_properties,
                    out.prepared.body,
                    frame_max=frame_max,
                )
                for out in outs
            ]
        )
        # queued first: the writer cannot send it, nor a confirm come, before the
        # books below are written, as nothing here awaits after the put
        await underlay.write_queue.put(ChannelFrame(payload=payload, should_close=False))
        confirms = []
        for tag, out in enumerate(outs, first):
            confirm = underlay.create_future()
            underlay.confirmations[tag] = confirm
            underlay.message_id_delivery_tag[out.message_id] = tag
            confirm.add_done_callback(functools.partial(_forget, underlay, out.message_id, tag))
            confirms.append(confirm)
        underlay.delivery_tag = first + len(outs) - 1
    return confirms
