"""A small client of RabbitMQ's management HTTP API, for what AMQP cannot tell.

AMQP can check that an exchange or queue exists, but not list objects or bindings.
The API is optional: every caller works without it and says what it could not check.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any, cast
from urllib.parse import quote, unquote, urlsplit

__all__ = ["ManagementApi"]


class ManagementApi:
    """Talks to ``http(s)://host:15672/api`` with the AMQP URL's credentials."""

    def __init__(self, amqp_url: str, base_url: str | None = None, timeout: float = 3.0) -> None:
        parts = urlsplit(amqp_url)
        scheme = "https" if parts.scheme == "amqps" else "http"
        self.base = (base_url or f"{scheme}://{parts.hostname or 'localhost'}:15672").rstrip("/")
        self.vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
        self._auth = base64.b64encode(f"{user}:{password}".encode()).decode()
        self.timeout = timeout
        self._available: bool | None = None

    def get(self, path: str) -> Any:
        """GET ``/api/{path}`` and decode its JSON."""
        request = urllib.request.Request(
            f"{self.base}/api/{path}", headers={"Authorization": f"Basic {self._auth}"}
        )
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            return json.load(response)

    @property
    def available(self) -> bool:
        if self._available is None:
            try:
                self.get("overview")
                self._available = True
            except (OSError, urllib.error.URLError, ValueError):
                self._available = False
        return self._available

    def queues(self, name_prefix: str) -> list[dict[str, Any]]:
        found = cast(list[dict[str, Any]], self.get(f"queues/{quote(self.vhost, safe='')}"))
        return [q for q in found if str(q.get("name", "")).startswith(name_prefix)]

    def exchanges(self, name_prefix: str) -> list[dict[str, Any]]:
        found = cast(list[dict[str, Any]], self.get(f"exchanges/{quote(self.vhost, safe='')}"))
        return [e for e in found if str(e.get("name", "")).startswith(name_prefix)]

    def bindings(self) -> set[tuple[str, str, str, str]]:
        """Every binding of the vhost as (source, destination, type, routing key)."""
        found = self.get(f"bindings/{quote(self.vhost, safe='')}")
        return {
            (b["source"], b["destination"], b["destination_type"], b["routing_key"]) for b in found
        }
