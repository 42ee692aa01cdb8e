"""What code that publishes needs of a publisher, as structural types.

Type a function's parameter with :class:`PublisherProtocol` (or its async twin) and it
takes a :class:`~rmqdelay.Publisher` in production and a
:class:`~rmqdelay.testing.InMemoryPublisher` in a unit test, with nothing to subclass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

from typing_extensions import Unpack

from .durations import DurationLike
from .journal.records import JournalRecord
from .journal.reschedule import RescheduleResult
from .journal.view import CancelResult
from .outgoing import PublishOptions, PublishResult

__all__ = ["AsyncPublisherProtocol", "PublisherProtocol"]


class PublisherProtocol(Protocol):
    """The operations of :class:`~rmqdelay.Publisher` (connecting and closing aside)."""

    def publish(
        self, destination: str, body: object, **options: Unpack[PublishOptions]
    ) -> PublishResult: ...

    def publish_many(self, requests: Iterable[Mapping[str, Any]]) -> list[PublishResult]: ...

    def check_destination(self, destination: str) -> None: ...

    def cancel(self, *message_ids: str, keys: Iterable[str] = ()) -> list[CancelResult]: ...

    def reschedule(
        self, id_or_key: str, *, delay: DurationLike | None = None, at: datetime | None = None
    ) -> RescheduleResult: ...

    def list_scheduled(
        self,
        *,
        destination: str | None = None,
        due_before: datetime | None = None,
        limit: int | None = None,
        key: str | None = None,
    ) -> list[JournalRecord]: ...


class AsyncPublisherProtocol(Protocol):
    """The operations of :class:`~rmqdelay.AsyncPublisher`: those of
    :class:`PublisherProtocol`, awaited."""

    async def publish(
        self, destination: str, body: object, **options: Unpack[PublishOptions]
    ) -> PublishResult: ...

    async def publish_many(self, requests: Iterable[Mapping[str, Any]]) -> list[PublishResult]: ...

    async def check_destination(self, destination: str) -> None: ...

    async def cancel(self, *message_ids: str, keys: Iterable[str] = ()) -> list[CancelResult]: ...

    async def reschedule(
        self, id_or_key: str, *, delay: DurationLike | None = None, at: datetime | None = None
    ) -> RescheduleResult: ...

    async def list_scheduled(
        self,
        *,
        destination: str | None = None,
        due_before: datetime | None = None,
        limit: int | None = None,
        key: str | None = None,
    ) -> list[JournalRecord]: ...
