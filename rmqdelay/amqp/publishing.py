"""The public surface of both publishers, written once.

:class:`~rmqdelay.Publisher` and :class:`~rmqdelay.AsyncPublisher` differ only in how
they carry out the two steps of a publish flow (:mod:`..core.steps`); their
constructor, their methods and the documentation of both live here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, Generic, TypeVar, cast

from typing_extensions import Unpack

from ..core.clock import ms_of_datetime
from ..core.durations import DurationLike
from ..core.journal import flows as journal_flows
from ..core.journal.reading import JournalFlow
from ..core.journal.records import JournalRecord
from ..core.journal.reschedule import RescheduleResult
from ..core.journal.view import CancelResult
from ..core.outgoing import PublishOptions
from ..core.publisher_core import PublisherCore
from ..core.steps import RECONNECT_PAUSES, Flow
from ..settings import Settings, mask_url
from .connections import CONNECT_TIMEOUT_S, address_of

__all__ = ["CLIENT_FAST_ENV", "FAILOVER_CLOSE_S", "PublisherSurface", "client_fast"]

log = logging.getLogger("rmqdelay.publisher")
FAILOVER_CLOSE_S = 5.0
"""How long a publisher leaving a node waits for that connection to close."""
CLIENT_FAST_ENV = "RMQDELAY_CLIENT_FAST"


def client_fast() -> bool:
    """False when ``RMQDELAY_CLIENT_FAST`` is 0 (or false, no, off): the publishers then
    use only their client library's public API, a way round a release that broke the
    private reaches their self-checks did not catch. Read at each use, so tests can flip it.
    """
    return os.environ.get(CLIENT_FAST_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


ConnT = TypeVar("ConnT")
OneT = TypeVar("OneT")
ManyT = TypeVar("ManyT")
NoneT = TypeVar("NoneT")


class PublisherSurface(Generic[ConnT, OneT, ManyT, NoneT]):
    """What both publishers offer; each adapter gives ``_run``, which carries out a flow.

    The sync publisher's ``_run`` returns what the flow returns, the async one's a
    coroutine of it, hence the type parameters: the connection's type, and what
    ``publish``, ``publish_many`` and ``check_destination`` return.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        connection: ConnT | None = None,
        window: int = 1000,
    ) -> None:
        """``connection``: publish on it and leave it to its owner, who reopens it if it
        drops; by default the publisher opens its own and reopens it itself.
        ``window``: how many confirms a batch may wait for at a time."""
        self.settings: Settings = Settings() if settings is None else settings
        self.core = PublisherCore(self.settings.layout, journal_bodies=self.settings.journal_bodies)
        self.core.read_back_timeout = self.settings.confirm_timeout
        self._connection = connection
        self._owns_connection = connection is None
        self._started = connection is not None
        """False until connect() and after close(): publishing then raises."""
        self._lost: object = None
        """Why the connection last closed, for the error that reports it."""
        self._window = window
        self._try_last: list[str] = []
        """The address of the node that last stopped confirming: tried after the others."""

    def _run(self, flow: Flow[Any]) -> Any:
        raise NotImplementedError

    def _leaving(self, reason: str) -> bool:
        """Whether to answer a :class:`~rmqdelay.core.steps.Failover` by moving: only
        from a connection of our own. Its node is tried last from now on: a node cut off
        from the cluster's majority still accepts connections, and gives no confirms."""
        if not self._owns_connection or self._connection is None:
            return False
        address = address_of(self._connection)
        if address is not None:
            self._try_last = [address]
        self._lost = reason
        log.warning(
            "%s from %s: reconnecting (that node is tried last) to send them again",
            reason,
            mask_url(address or self.settings.masked_url),
        )
        return True

    @property
    def _failover_timeout(self) -> float:
        """How long a failover gives each address: a user's ``confirm_timeout`` is the
        wait they accept, and a cut-off publisher should not add a second one."""
        return min(self.settings.confirm_timeout, CONNECT_TIMEOUT_S)

    def _stay(self, why: BaseException) -> None:
        """No other connection could be opened: keep this one, and the errors stand."""
        log.warning("cannot move to another node (%s): the messages' errors stand", why)

    def _reconnect_pauses(self, failures: list[Exception]) -> Iterator[float]:
        """The pause before each attempt to reopen a dropped connection.

        Raises PublisherClosedError at once for a connection this publisher was given,
        and after the last failed attempt (``failures``) for its own.
        """
        if not self._owns_connection:
            raise self.core.lost(self._lost or "closed", owned=False)
        yield from RECONNECT_PAUSES
        raise self.core.lost(self._lost or "closed", owned=True, attempts=failures)

    def publish(self, destination: str, body: object, **options: Unpack[PublishOptions]) -> OneT:
        """Publish one message and return once the broker confirmed it.

        ``options``: ``delay`` or ``at``, ``headers``, ``message_id``, and the AMQP
        properties ``correlation_id``, ``content_type``, ``content_encoding``,
        ``priority``, ``reply_to``, ``type`` and ``app_id`` (see :class:`PublishOptions`).
        What cannot be sent as given raises before anything is sent; an error after
        sending means the message may or may not have been delivered.
        """
        return cast(OneT, self._run(self.core.publish(destination, body, options)))

    def publish_many(self, requests: Iterable[Mapping[str, Any]]) -> ManyT:
        """Publish many messages with pipelined confirms; each request holds publish's args.

        Everything is validated before the first message is sent; the results follow
        the order of the requests, and BatchPublishError names the failures.
        """
        return cast(ManyT, self._run(self.core.publish_many(requests)))

    def check_destination(self, destination: str) -> NoneT:
        """Raise UnknownDestinationError unless the work queue exists (passive, cached)."""
        return cast(NoneT, self._run(self.core.check_destination(destination)))

    def _cancel_flow(
        self, message_ids: Iterable[str], keys: Iterable[str] = ()
    ) -> JournalFlow[list[CancelResult]]:
        """The flow of ``cancel``, which each adapter runs (:mod:`..core.journal.flows`)."""
        if isinstance(keys, str):
            keys = (keys,)  # keys="order-42" means that key, not its letters
        return journal_flows.cancel(
            self.core.layout, message_ids, keys=keys, timeout=self.settings.confirm_timeout
        )

    def _reschedule_flow(
        self, target: str, delay: DurationLike | None, at: datetime | None
    ) -> Flow[RescheduleResult]:
        """The flow of ``reschedule``."""
        return self.core.reschedule(
            target, delay=delay, at=at, timeout=self.settings.confirm_timeout
        )

    def _list_flow(
        self,
        destination: str | None,
        due_before: datetime | None,
        limit: int | None,
        progress: Callable[[int], None] | None,
        key: str | None = None,
    ) -> JournalFlow[list[JournalRecord]]:
        """The flow of ``list_scheduled``."""
        return journal_flows.list_scheduled(
            self.core.layout,
            destination=destination,
            due_before_ms=None if due_before is None else ms_of_datetime(due_before),
            limit=limit,
            timeout=self.settings.confirm_timeout,
            progress=progress,
            key=key,
        )
