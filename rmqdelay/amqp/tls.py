"""TLS for ``amqps://`` URLs, one context for both client libraries."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..errors import ConfigurationError

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["ssl_context"]


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """A verifying context for an ``amqps://`` URL, or None for plain ``amqp://``."""
    if urlsplit(settings.urls[0]).scheme != "amqps":  # the settings: one scheme for all
        return None
    try:
        context = ssl.create_default_context(
            cafile=str(settings.tls_ca_file) if settings.tls_ca_file else None
        )
        if settings.tls_cert_file:
            context.load_cert_chain(
                str(settings.tls_cert_file),
                str(settings.tls_key_file) if settings.tls_key_file else None,
            )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(
            f"cannot load the TLS files (tls_ca_file, tls_cert_file, tls_key_file): {exc}"
        ) from None
    return context
