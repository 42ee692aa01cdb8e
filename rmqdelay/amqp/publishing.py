"""What both broker publishers share beyond the API: the constructor and failover.

The operations are declared once in :mod:`..core.publishing.aio_api`;
:class:`~rmqdelay.Publisher` and :class:`~rmqdelay.AsyncPublisher` differ only in how
they carry out a flow's steps (:mod:`..core.steps`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Generic, TypeVar

from ..core.publishing.publisher import PublisherCore
from ..core.steps import RECONNECT_PAUSES
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


class PublisherSurface(Generic[ConnT]):
    """The state both broker publishers keep, on a connection of type ``ConnT``."""

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
        self.core = PublisherCore(
            self.settings.layout,
            journal_bodies=self.settings.journal_bodies,
            timeout=self.settings.confirm_timeout,
        )
        self._connection = connection
        self._owns_connection = connection is None
        self._started = connection is not None
        """False until connect() and after close(): publishing then raises."""
        self._lost: object = None
        """Why the connection last closed, for the error that reports it."""
        self._window = window
        self._try_last: list[str] = []
        """The address of the node that last stopped confirming: tried after the others."""

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
