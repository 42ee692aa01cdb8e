"""Opening connections, in one place for both client libraries: names, TLS, errors.

Each connection is named after its role (``{connection_name}.worker``...), so an
operator can tell them apart in the management UI and tests can close one.

With several broker addresses (a cluster's nodes), every connect and reconnect tries them
in ``url_order``, so a client whose node died moves to a live one.

Why a connect failed is told by :func:`connection_failure`, for pika and aiormq alike,
so the CLI, the publishers and the worker use the same words, and the worker knows
what to retry (a refused or dropped connection) and what to stop on (credentials, an
unknown virtual host, no access to it, an untrusted certificate).

aio-pika, aiormq and yarl are imported by :func:`connect_async` only: the sync side
(``rmqdelay publish`` and the other commands) starts without them. The classifier
checks aiormq's and asyncio's errors only once those modules are loaded: an error of a
module never imported cannot have been raised.
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import socket
import ssl
import sys
import weakref
from collections.abc import Collection
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import pika
import pika.exceptions
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorException,
    AMQPConnectorStackTimeout,
)

from ..errors import ConnectionFailedError
from ..settings import Settings, mask_url
from .tls import ssl_context

if TYPE_CHECKING:
    from aio_pika.abc import AbstractConnection, AbstractRobustConnection

__all__ = [
    "address_of",
    "candidate_urls",
    "connect_async",
    "connect_blocking",
    "connection_failure",
    "user_of",
]

CONNECT_TIMEOUT_S = 10.0
_URL_HINT = "check the url setting (--url, RMQDELAY_URL)"
_REPLY = re.compile(r"\((\d{3})\) '(.*)'", re.S)  # pika: "...: (530) 'NOT_ALLOWED - ...'"
_TRANSIENT_TLS = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)
_PIKA_CONNECT_ERRORS = (pika.exceptions.AMQPError, AMQPConnectorException, OSError, ValueError)
"""What pika raises when a connection cannot open: its workflow's errors (a handshake
that timed out, say) are not :class:`pika.exceptions.AMQPError`."""


_ADDRESSES: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def candidate_urls(settings: Settings, last: Collection[str] = ()) -> list[str]:
    """The addresses to try, in order: as given, or shuffled afresh at each connect;
    those in ``last`` (a node that stopped confirming) after all the others."""
    urls = settings.urls
    if settings.url_order == "shuffled":
        urls = random.sample(urls, len(urls))
    return [u for u in urls if u not in last] + [u for u in urls if u in last]


def address_of(connection: object) -> str | None:
    """The address (one of ``settings.urls``) this module opened ``connection`` to."""
    return _ADDRESSES.get(connection)


# --------------------------------------------------------------------------- why it failed


def user_of(address: str) -> str:
    """The user an AMQP URL logs in as (``guest`` when it names none)."""
    return _user_and_vhost(address)[0]


def _user_and_vhost(address: str) -> tuple[str, str]:
    parts = urlsplit(address)
    user = unquote(parts.username) if parts.username else "guest"
    return user, unquote(parts.path[1:]) if len(parts.path) > 1 else "/"


def _aiormq_error(*names: str) -> tuple[type[BaseException], ...]:
    """aiormq's exception classes of those ``names``; none when aiormq is not loaded."""
    errors = sys.modules.get("aiormq.exceptions")
    return () if errors is None else tuple(getattr(errors, name) for name in names)


def _timeouts() -> tuple[type[BaseException], ...]:
    """The timeouts a connect raises; asyncio's is its own class before Python 3.11."""
    asyncio = sys.modules.get("asyncio")
    found: tuple[type[BaseException], ...] = (TimeoutError, socket.timeout)
    return found if asyncio is None else (*found, asyncio.TimeoutError)


def _root(exc: BaseException) -> BaseException:
    """The exception pika wrapped (it nests the socket's error in its own, twice), or
    the TLS error aiormq raised its AMQPConnectionError from (``[Errno 1] [SSL: ...]``)."""
    seen = 0
    while seen < 5:
        seen += 1
        inner = getattr(exc, "exception", None)
        if isinstance(exc, AMQPConnectionWorkflowFailed) and exc.exceptions:
            inner = exc.exceptions[-1]  # pika's workflow: the last attempt's error
        if not isinstance(inner, BaseException):
            inner = exc.args[0] if exc.args and isinstance(exc.args[0], BaseException) else None
        if inner is None and isinstance(exc.__cause__, ssl.SSLError):
            inner = exc.__cause__
        if inner is None:
            return exc
        exc = inner
    return exc


def _broker_reply(exc: BaseException) -> tuple[int | None, str]:
    """The broker's reply code and text in a refusal, from either library."""
    if isinstance(exc, _aiormq_error("ConnectionClosed")) and len(exc.args) >= 2:
        return int(exc.args[0]), str(exc.args[1])
    if isinstance(exc, pika.exceptions.ConnectionClosed):
        return exc.reply_code, exc.reply_text
    text = " ".join(str(a) for a in exc.args)
    match = _REPLY.search(text)
    if match:
        return int(match.group(1)), match.group(2)
    return None, text


def connection_failure(
    exc: BaseException, address: str, settings: Settings
) -> ConnectionFailedError:
    """Say why connecting to ``address`` failed, for pika's and aiormq's errors alike.

    The message names what to fix and never the password; ``transient`` tells a
    caller whether trying again can help.
    """
    where = mask_url(address)
    user, vhost = _user_and_vhost(address)
    exc = _root(exc)
    if isinstance(exc, ConnectionFailedError):
        return exc
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or type(exc).__name__
        hint = (
            "the server does not speak TLS on that port: amqps:// needs the broker's TLS "
            "port (5671 by default), or write amqp://"
            if reason == "WRONG_VERSION_NUMBER"
            else "check tls_ca_file (RMQDELAY_TLS_CA_FILE) and the host name in the URL"
        )
        return ConnectionFailedError(
            f"cannot connect to {where}: TLS failed ({reason}); {hint}",
            transient=isinstance(exc, _TRANSIENT_TLS),
        )
    if isinstance(
        exc,
        (
            *_aiormq_error("ProbableAuthenticationError", "AuthenticationError"),
            pika.exceptions.ProbableAuthenticationError,
            pika.exceptions.AuthenticationError,
        ),
    ):
        guest = (
            "; the user 'guest' may log in only from localhost"
            if user == "guest"
            and urlsplit(address).hostname not in ("localhost", "127.0.0.1", "::1")
            else ""
        )
        return ConnectionFailedError(
            f"the broker at {where} refused the login of user {user!r}: wrong user name or "
            f"password{guest}; {_URL_HINT}",
            transient=False,
        )
    code, text = _broker_reply(exc)
    if code == 530 or isinstance(exc, pika.exceptions.ProbableAccessDeniedError):
        if "not found" in text:
            return ConnectionFailedError(
                f"virtual host {vhost!r} does not exist on the broker at {where}: create it, "
                f"or fix the vhost at the end of the URL ('/' is written %2F); {_URL_HINT}",
                transient=False,
            )
        if "refused for user" in text and "limit" not in text:
            return ConnectionFailedError(
                f"user {user!r} has no access to virtual host {vhost!r} on the broker at "
                f"{where}: grant it permissions there (rabbitmqctl set_permissions -p "
                f"{vhost} {user} ...), or use another user or vhost; {_URL_HINT}",
                transient=False,
            )
    if code is not None:  # closed by the broker for another reason: shutting down, a limit
        return ConnectionFailedError(f"the broker at {where} closed the connection: {text}")
    host = urlsplit(address).hostname
    if isinstance(exc, socket.gaierror):
        return ConnectionFailedError(f"cannot connect to {where}: unknown host {host!r}")
    if isinstance(exc, _aiormq_error("AMQPConnectionError")) and exc.args:
        errno = exc.args[0]
        if errno in (-2, -3, -5):  # EAI_NONAME, EAI_AGAIN, EAI_NODATA (aiormq's gaierror)
            return ConnectionFailedError(f"cannot connect to {where}: unknown host {host!r}")
        if errno == 111:
            return ConnectionFailedError(f"cannot connect to {where}: connection refused")
    if isinstance(exc, ConnectionRefusedError):
        return ConnectionFailedError(f"cannot connect to {where}: connection refused")
    if isinstance(exc, AMQPConnectorStackTimeout):  # TCP connected, AMQP did not answer
        return ConnectionFailedError(
            f"cannot connect to {where}: the broker accepted the connection but did not "
            f"answer the AMQP handshake within {_stack_timeout(address):g}s (a broker "
            "starting, overloaded or stuck, or a port that does not speak AMQP)"
        )
    if isinstance(exc, _timeouts()):
        return ConnectionFailedError(
            f"cannot connect to {where}: no answer within {CONNECT_TIMEOUT_S:g}s"
        )
    if isinstance(
        exc,
        (pika.exceptions.IncompatibleProtocolError, *_aiormq_error("IncompatibleProtocolError")),
    ):
        return ConnectionFailedError(
            f"cannot connect to {where}: the server closed the connection during the AMQP "
            "handshake (a broker starting or stopping, or not an AMQP port: 5672, 5671 for "
            "amqps)"
        )
    if isinstance(exc, ValueError):  # the URL itself, as a client library reads it
        return ConnectionFailedError(
            f"cannot use the URL {where}: {_redact(str(exc), address)}; {_URL_HINT}",
            transient=False,
        )
    return ConnectionFailedError(
        f"cannot connect to {where}: {type(exc).__name__} {_redact(str(exc), address)}"
    )


def _stack_timeout(address: str) -> float:
    """The seconds pika gave the whole TCP/TLS/AMQP opening of ``address``."""
    try:
        timeout = pika.URLParameters(address).stack_timeout
    except (ValueError, TypeError):
        timeout = None
    return timeout or pika.ConnectionParameters.DEFAULT_STACK_TIMEOUT


def _redact(text: str, address: str) -> str:
    """``text`` without the password of ``address``, should a library quote it."""
    password = urlsplit(address).password
    for secret in {password, unquote(password or "")} - {None, ""}:
        text = text.replace(str(secret), "***")
    return mask_url(text) if "://" in text else text


def _all_failed(
    failures: list[tuple[str, ConnectionFailedError]], settings: Settings
) -> ConnectionFailedError:
    """One error for several addresses: permanent as soon as one of them says so."""
    for _address, failure in failures:
        if not failure.transient:
            return failure
    if len(failures) == 1:
        return failures[0][1]
    listed = "; ".join(str(f).removeprefix("cannot connect to ") for _a, f in failures)
    return ConnectionFailedError(f"cannot connect to any broker address: {listed}")


# --------------------------------------------------------------------------- connecting


def _pika_params(
    settings: Settings,
    address: str,
    role: str,
    context: ssl.SSLContext | None,
    timeout: float = CONNECT_TIMEOUT_S,
) -> pika.URLParameters:
    params = pika.URLParameters(address)
    params.client_properties = {"connection_name": f"{settings.connection_name}.{role}"}
    params.connection_attempts = 1
    params.socket_timeout = timeout
    if timeout < CONNECT_TIMEOUT_S:  # the whole opening too, not each socket wait alone
        params.stack_timeout = timeout
    if context is not None:
        params.ssl_options = pika.SSLOptions(context, server_hostname=params.host)
    return params


def connect_blocking(
    settings: Settings,
    role: str,
    *,
    last: Collection[str] = (),
    timeout: float = CONNECT_TIMEOUT_S,
) -> pika.BlockingConnection:
    """Open a pika connection named after its role, so operators can tell it apart.

    Each address in turn (``last`` after the others), each given ``timeout`` seconds; a
    refusal that another address cannot cure (credentials, an unknown vhost) ends the
    attempt at once.
    """
    context = ssl_context(settings)
    failures: list[tuple[str, ConnectionFailedError]] = []
    for address in candidate_urls(settings, last):
        try:
            params = _pika_params(settings, address, role, context, timeout)
            connection = pika.BlockingConnection(params)
            _ADDRESSES[connection] = address
            return connection
        except _PIKA_CONNECT_ERRORS as exc:
            failure = connection_failure(exc, address, settings)
        failures.append((address, failure))
        if not failure.transient:
            break
    raise _all_failed(failures, settings) from None


def _refusal_reason(settings: Settings, address: str) -> ConnectionFailedError | None:
    """Ask again with pika why the broker closed the connection as it opened the vhost.

    aiormq reports that close as an ``InvalidFrameError`` without the broker's reply;
    pika keeps it ("vhost x not found", "access to vhost refused"), so both libraries
    can report it in the same words.
    """
    quiet = logging.getLogger("pika")  # pika logs the refusal at ERROR, traceback and all
    level = quiet.level
    quiet.setLevel(logging.CRITICAL + 1)
    try:
        connection = pika.BlockingConnection(
            _pika_params(settings, address, "probe", ssl_context(settings))
        )
    except _PIKA_CONNECT_ERRORS as exc:
        return connection_failure(exc, address, settings)
    finally:
        quiet.setLevel(level)
    with contextlib.suppress(pika.exceptions.AMQPError, OSError):
        connection.close()
    return None


async def connect_async(
    settings: Settings,
    role: str,
    *,
    robust: bool = False,
    last: Collection[str] = (),
    timeout: float = CONNECT_TIMEOUT_S,
) -> AbstractConnection:
    """Open an aio-pika connection; ``robust`` reopens it and its channels by itself.
    The addresses in ``last`` are tried after the others, each given ``timeout`` seconds.

    The name goes in the URL's ``name`` query, which every aiormq reads; aio-pika 9
    drops ``client_properties`` when it is given a URL.
    """
    import asyncio

    import aio_pika
    import aiormq
    from yarl import URL

    connect = aio_pika.connect_robust if robust else aio_pika.connect
    context = ssl_context(settings)
    failures: list[tuple[str, ConnectionFailedError]] = []
    for address in candidate_urls(settings, last):
        try:
            url = str(URL(address).update_query(name=f"{settings.connection_name}.{role}"))
            connection: AbstractConnection | AbstractRobustConnection = await connect(
                url, ssl_context=context, timeout=timeout
            )
            _ADDRESSES[connection] = address
            return connection
        except aiormq.exceptions.InvalidFrameError as exc:
            failure = None
            if "Connection.Close" in str(exc):  # refused as it opened the vhost: ask why
                failure = await asyncio.to_thread(_refusal_reason, settings, address)
            failure = failure or connection_failure(exc, address, settings)
        except (aiormq.exceptions.AMQPError, OSError, asyncio.TimeoutError, ValueError) as exc:
            failure = connection_failure(exc, address, settings)
        failures.append((address, failure))
        if not failure.transient:
            break
    raise _all_failed(failures, settings) from None
