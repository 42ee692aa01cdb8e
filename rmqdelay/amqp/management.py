"""A small client of RabbitMQ's management HTTP API, for what AMQP cannot tell.

AMQP can check that an exchange or queue exists, but not list objects or bindings.
The API is optional: every caller works without it and says what it could not check.

Where it is: the ``management_url`` setting, else ``http://<AMQP host>:15672``
(``https`` when the AMQP URL is ``amqps``).  It logs in with the management URL's
credentials, else the AMQP URL's; ``base`` never holds them, so it can be shown.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from ..settings import Settings

__all__ = ["MANAGEMENT_URL_HINT", "ManagementApi", "management_location"]

DEFAULT_PORT = 15672
MANAGEMENT_URL_HINT = (
    "the management_url setting (env RMQDELAY_MANAGEMENT_URL, flag --management-url)"
)


def management_location(amqp_url: str, management_url: str | None) -> tuple[str, str, str]:
    """(base URL without credentials, user, password) of the API for this broker."""
    amqp = urlsplit(amqp_url)
    if management_url:
        parts = urlsplit(management_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"management_url must look like http(s)://host:port, got {parts.scheme}://..."
            )
    else:
        scheme = "https" if amqp.scheme == "amqps" else "http"
        host = amqp.hostname or "localhost"
        if ":" in host:  # an IPv6 literal
            host = f"[{host}]"
        parts = urlsplit(f"{scheme}://{host}:{DEFAULT_PORT}")
    source = parts if parts.username is not None else amqp
    user = unquote(source.username or "guest")
    password = unquote(source.password or "guest")
    netloc = parts.netloc.rpartition("@")[2]
    base = urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
    return base, user, password


class ManagementApi:
    """Talks to ``<base>/api`` (see the module docstring for where and as whom)."""

    def __init__(
        self,
        amqp_url: str,
        management_url: str | None = None,
        timeout: float = 3.0,
        *,
        ca_file: Path | None = None,
    ) -> None:
        self.base, user, password = management_location(amqp_url, management_url)
        self.configured = management_url is not None
        parts = urlsplit(amqp_url)
        self.vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
        self._auth = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._context = (
            ssl.create_default_context(cafile=str(ca_file))
            if ca_file and self.base.startswith("https:")
            else None
        )
        self.timeout = timeout
        self._problem: str | None = None
        self._checked = False

    @classmethod
    def for_settings(cls, settings: Settings, timeout: float = 3.0) -> ManagementApi:
        """The API of the settings' broker; an https one trusts ``tls_ca_file`` too."""
        return cls(settings.url, settings.management_url, timeout, ca_file=settings.tls_ca_file)

    def get(self, path: str) -> Any:
        """GET ``/api/{path}`` and decode its JSON."""
        request = urllib.request.Request(
            f"{self.base}/api/{path}", headers={"Authorization": f"Basic {self._auth}"}
        )
        with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as r:
            return json.load(r)

    @property
    def problem(self) -> str | None:
        """Why the API cannot be used (one line naming the URL and the setting), or None."""
        if not self._checked:
            self._checked = True
            self._problem = self._probe()
        return self._problem

    @property
    def available(self) -> bool:
        return self.problem is None

    def _probe(self) -> str | None:
        where = f"the management API at {self.base}"
        try:
            overview = self.get("overview")
        except urllib.error.HTTPError as exc:
            what = "refused the credentials" if exc.code in (401, 403) else "failed"
            why = f"{where} {what} (HTTP {exc.code})"
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            why = f"{where} is unreachable ({reason})"
        except ValueError:
            why = f"{where} did not answer JSON: is it a management API?"
        else:
            if isinstance(overview, dict) and "rabbitmq_version" in overview:
                return None
            why = f"{where} did not answer like RabbitMQ's management API"
        if self.configured:
            return f"{why}; check {MANAGEMENT_URL_HINT}"
        return f"{why}; that is the default: set {MANAGEMENT_URL_HINT} to the broker's"

    def overview(self) -> dict[str, Any]:
        return cast(dict[str, Any], self.get("overview"))

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
