"""The public surface of both publishers, written once.

:class:`~rmqdelay.Publisher` and :class:`~rmqdelay.AsyncPublisher` differ only in how
they carry out the two steps of a publish flow (:mod:`..core.outgoing`); their
constructor, their methods and the documentation of both live here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar, cast

from typing_extensions import Unpack

from ..core.outgoing import RECONNECT_PAUSES, Flow, PublisherCore, PublishOptions
from ..settings import Settings

__all__ = ["PublisherSurface"]

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
        self.settings = settings or Settings()
        self.core = PublisherCore(self.settings.layout, journal_bodies=self.settings.journal_bodies)
        self._connection = connection
        self._owns_connection = connection is None
        self._started = connection is not None
        """False until connect() and after close(): publishing then raises."""
        self._lost: object = None
        """Why the connection last closed, for the error that reports it."""
        self._window = window

    def _run(self, flow: Flow[Any]) -> Any:
        raise NotImplementedError

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
