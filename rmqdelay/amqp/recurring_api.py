"""Recurring schedules on both publishers: ``add_recurring`` and its peers.

The calls are flows (:mod:`..core.journal.recurring_flows`); these mixins give them to
:class:`~rmqdelay.Publisher` (sync) and :class:`~rmqdelay.AsyncPublisher` (async), which
carry out their steps as they do a publish's.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from typing_extensions import Unpack

from ..core.durations import DurationLike
from ..core.journal import recurring_flows as flows
from ..core.journal.recurring import RecurringResult, RecurringSchedule
from ..core.messages import MessageProperties

if TYPE_CHECKING:
    from ..core.publisher_core import PublisherCore
    from ..settings import Settings

__all__ = ["AsyncRecurringMethods", "RecurringFlows", "RecurringMethods"]


class RecurringFlows:
    """The flows of the calls, for a class with ``core``, ``settings`` and ``_run``."""

    if TYPE_CHECKING:
        core: PublisherCore

        @property
        def settings(self) -> Settings: ...

        def _run(self, flow: Any) -> Any: ...

    def _add_flow(
        self,
        name: str,
        destination: str,
        body: object,
        cron: str | None,
        tz: str | None,
        every: DurationLike | None,
        first_at: datetime | None,
        headers: Mapping[str, Any] | None,
        properties: Mapping[str, Any],
    ) -> flows.AnyFlow:
        return flows.add(
            self.core,
            name,
            destination,
            body,
            cron=cron,
            tz=tz,
            every=every,
            first_at=first_at,
            headers=headers,
            properties=properties,
            timeout=self.settings.confirm_timeout,
        )

    def _switch_flow(self, name: str, op: str) -> flows.AnyFlow:
        return flows.switch(self.core.layout, name, op, timeout=self.settings.confirm_timeout)


class RecurringMethods(RecurringFlows):
    """Recurring schedules, for the synchronous publisher."""

    def add_recurring(
        self,
        name: str,
        destination: str,
        body: object,
        *,
        cron: str | None = None,
        tz: str | None = None,
        every: DurationLike | None = None,
        first_at: datetime | None = None,
        headers: Mapping[str, Any] | None = None,
        **properties: Unpack[MessageProperties],
    ) -> RecurringResult:
        """Send ``body`` to ``destination`` on a schedule: ``cron="0 9 * * *"`` in ``tz``
        (an IANA zone, default UTC; DST as cron does it), or ``every="15m"`` (absolute
        time, from the Unix epoch or from ``first_at``). Each occurrence is a delayed
        message keyed ``recurring:NAME@<ms>``; the worker that gets one publishes the next
        before calling the handler, so a crash neither doubles nor loses a firing. Needs
        the schedule journal. ``outcome`` ``exists`` when the schedule is already there
        with this rule and destination; a RecurringError when it is there with others."""
        flow = self._add_flow(
            name, destination, body, cron, tz, every, first_at, headers, properties
        )
        result: RecurringResult = self._run(flow)
        return result

    def pause_recurring(self, name: str) -> RecurringResult:
        """Pause: occurrences go on (so resuming keeps the rule's times) but no handler
        runs until ``resume_recurring``."""
        result: RecurringResult = self._run(self._switch_flow(name, "pause"))
        return result

    def resume_recurring(self, name: str) -> RecurringResult:
        """Resume a paused schedule from its next occurrence (the paused ones are not
        run late)."""
        result: RecurringResult = self._run(self._switch_flow(name, "resume"))
        return result

    def remove_recurring(self, name: str) -> RecurringResult:
        """Remove: the chain ends, the pending occurrence is cancelled."""
        result: RecurringResult = self._run(self._switch_flow(name, "remove"))
        return result

    def list_recurring(self) -> list[RecurringSchedule]:
        """Every schedule not removed, by name, with its state and next and last
        occurrences."""
        found: list[RecurringSchedule] = self._run(
            flows.listed(self.core.layout, timeout=self.settings.confirm_timeout)
        )
        return found


class AsyncRecurringMethods(RecurringFlows):
    """Recurring schedules, for the asyncio publisher (see :class:`RecurringMethods`)."""

    async def add_recurring(
        self,
        name: str,
        destination: str,
        body: object,
        *,
        cron: str | None = None,
        tz: str | None = None,
        every: DurationLike | None = None,
        first_at: datetime | None = None,
        headers: Mapping[str, Any] | None = None,
        **properties: Unpack[MessageProperties],
    ) -> RecurringResult:
        """:meth:`RecurringMethods.add_recurring`, awaited."""
        flow = self._add_flow(
            name, destination, body, cron, tz, every, first_at, headers, properties
        )
        result: RecurringResult = await self._run(flow)
        return result

    async def pause_recurring(self, name: str) -> RecurringResult:
        result: RecurringResult = await self._run(self._switch_flow(name, "pause"))
        return result

    async def resume_recurring(self, name: str) -> RecurringResult:
        result: RecurringResult = await self._run(self._switch_flow(name, "resume"))
        return result

    async def remove_recurring(self, name: str) -> RecurringResult:
        result: RecurringResult = await self._run(self._switch_flow(name, "remove"))
        return result

    async def list_recurring(self) -> list[RecurringSchedule]:
        found: list[RecurringSchedule] = await self._run(
            flows.listed(self.core.layout, timeout=self.settings.confirm_timeout)
        )
        return found
