"""Opening connections, in one place for both client libraries: names, TLS, errors.

Each connection is named after its role (``{connection_name}.worker``...), so an
operator can tell them apart in the management UI and tests can close one.

With several broker addresses (a cluster's nodes), every connect and reconnect tries them
in ``url_order``, so a client whose node died moves to a live one.
"""

from __future__ import annotations

import random
import ssl

import aio_pika
import aiormq
import pika
import pika.exceptions
from aio_pika.abc import AbstractConnection, AbstractRobustConnection
from yarl import URL

from ..errors import ConnectionFailedError
from ..settings import Settings
from .tls import ssl_context

__all__ = ["candidate_urls", "connect_async", "connect_blocking"]


def candidate_urls(settings: Settings) -> list[str]:
    """The addresses to try, in order: as given, or shuffled afresh at each connect."""
    urls = settings.urls
    return random.sample(urls, len(urls)) if settings.url_order == "shuffled" else urls


def connect_blocking(settings: Settings, role: str) -> pika.BlockingConnection:
    """Open a pika connection named after its role, so operators can tell it apart."""
    context = ssl_context(settings)
    candidates = []
    for url in candidate_urls(settings):
        params = pika.URLParameters(url)
        params.client_properties = {"connection_name": f"{settings.connection_name}.{role}"}
        if context is not None:
            params.ssl_options = pika.SSLOptions(context, server_hostname=params.host)
        candidates.append(params)
    try:  # pika tries each address in turn
        return pika.BlockingConnection(candidates)
    except ssl.SSLError as exc:
        raise ConnectionFailedError(
            f"cannot connect to {settings.masked_url}: TLS failed ({exc.reason}); "
            "check tls_ca_file (RMQDELAY_TLS_CA_FILE) and the host name in the URL"
        ) from None
    except (pika.exceptions.AMQPConnectionError, OSError) as exc:
        raise ConnectionFailedError(
            f"cannot connect to {settings.masked_url}: {exc!r}; check --url / RMQDELAY_URL"
        ) from None


async def connect_async(
    settings: Settings, role: str, *, robust: bool = False
) -> AbstractConnection:
    """Open an aio-pika connection; ``robust`` reopens it and its channels by itself.

    The name goes in the URL's ``name`` query, which every aiormq reads; aio-pika 9
    drops ``client_properties`` when it is given a URL.
    """
    connect = aio_pika.connect_robust if robust else aio_pika.connect
    urls = candidate_urls(settings)
    try:
        for n, address in enumerate(urls, 1):
            url = str(URL(address).update_query(name=f"{settings.connection_name}.{role}"))
            try:
                connection: AbstractConnection | AbstractRobustConnection = await connect(
                    url, ssl_context=ssl_context(settings), timeout=10
                )
                break
            except (aiormq.exceptions.AMQPConnectionError, OSError, TimeoutError):
                if n == len(urls):  # the last address: report the failure below
                    raise
    except ssl.SSLError as exc:
        raise ConnectionFailedError(
            f"cannot connect to {settings.masked_url}: TLS failed ({exc.reason}); "
            "check tls_ca_file (RMQDELAY_TLS_CA_FILE) and the host name in the URL"
        ) from None
    except (aiormq.exceptions.AMQPError, OSError, TimeoutError) as exc:
        raise ConnectionFailedError(
            f"cannot connect to {settings.masked_url}: {type(exc).__name__}; "
            "check --url / RMQDELAY_URL"
        ) from None
    return connection
