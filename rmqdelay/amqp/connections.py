"""Opening connections, in one place for both client libraries: names, TLS, errors.

Each connection is named after its role (``{connection_name}.worker``...), so an
operator can tell them apart in the management UI and tests can close one.
"""

from __future__ import annotations

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

__all__ = ["connect_async", "connect_blocking"]


def connect_blocking(settings: Settings, role: str) -> pika.BlockingConnection:
    """Open a pika connection named after its role, so operators can tell it apart."""
    params = pika.URLParameters(settings.url)
    params.client_properties = {"connection_name": f"{settings.connection_name}.{role}"}
    context = ssl_context(settings)
    if context is not None:
        params.ssl_options = pika.SSLOptions(context, server_hostname=params.host)
    try:
        return pika.BlockingConnection(params)
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
    url = str(URL(settings.url).update_query(name=f"{settings.connection_name}.{role}"))
    connect = aio_pika.connect_robust if robust else aio_pika.connect
    try:
        connection: AbstractConnection | AbstractRobustConnection = await connect(
            url, ssl_context=ssl_context(settings), timeout=10
        )
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
