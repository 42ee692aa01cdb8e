"""A small client of RabbitMQ's management HTTP API, for what AMQP cannot tell.

AMQP can check that an exchange or queue exists, but not list objects or bindings.
The API is optional: every caller works without it and says what it could not check.

Where it is: the ``management_url`` setting (several: tried in order until one
answers), else ``http://<host>:15672`` of each AMQP URL (``https`` when it is
``amqps``). Any node of the cluster will do: the API shows the whole cluster. It logs
in with the management URL's credentials, else the AMQP URL's; of an AMQP URL, only
its vhost ever goes into a request's path. ``base`` never holds credentials, so it can
be shown.
"""

from __future__ import annotations

import base64
import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from ..settings import SecretUrl, Settings, split_urls, vhost_of

__all__ = [
    "MANAGEMENT_URL_HINT",
    "ManagementApi",
    "management_location",
    "management_locations",
    "same_cluster",
]

DEFAULT_PORT = 15672
GET_RETRY_PAUSES_S = (0.2, 0.5)
"""Pauses before a GET answered with a 5xx is tried again: RabbitMQ 3.10's API answers 500
to a listing of queues that races a queue's deletion (seen with two test workers)."""
MANAGEMENT_URL_HINT = (
    "the management_url setting (env RMQDELAY_MANAGEMENT_URL, flag --management-url)"
)


def _listed(urls: str | SecretUrl | Sequence[str] | None) -> list[str]:
    if urls is None or isinstance(urls, (str, SecretUrl)):
        return split_urls(urls)
    return [u.strip() for u in urls if u.strip()]


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


def management_locations(
    amqp_urls: Sequence[str], management_urls: Sequence[str] = ()
) -> list[tuple[str, str, str]]:
    """Every API to try, in order, as :func:`management_location` gives each.

    The management URLs given; else each AMQP node's host on :15672 (with that URL's
    credentials). A management URL without credentials takes those of the AMQP URL of
    its host, else the first AMQP URL's.
    """
    found: dict[str, tuple[str, str, str]] = {}
    if management_urls:
        hosts = {urlsplit(u).hostname: u for u in reversed(amqp_urls)}
        for url in management_urls:
            amqp = hosts.get(urlsplit(url).hostname, amqp_urls[0] if amqp_urls else "")
            location = management_location(amqp, url)
            found.setdefault(location[0], location)
    else:
        for amqp in amqp_urls or ["amqp://localhost"]:
            location = management_location(amqp, None)
            found.setdefault(location[0], location)
    return list(found.values())


def _short(host: str) -> str:
    return host.split(".", 1)[0].lower()


def same_cluster(
    amqp_cluster_name: str, api_cluster_name: str, api_node: str | None, nodes: Sequence[str]
) -> bool | None:
    """Whether the node an AMQP connection reached is of the API's cluster: None when the
    API cannot tell (its user may not list the nodes).

    ``cluster_name`` is the cluster's, when an operator set one: equal names say it.
    Unset, each node reports its own default, ``<node's name>@<its machine's FQDN>``
    (RabbitMQ 4.0.5's nodes ``rmqd-c4-1@localhost`` report ``rmqd-c4-1@vm``): then the
    AMQP node is of the cluster when one of the API's ``nodes`` has its name and is on
    its machine (by host name, or, on the API node's own machine, as the API node is).
    """
    if amqp_cluster_name == api_cluster_name:
        return True
    if not nodes:
        return None
    name, _, host = amqp_cluster_name.partition("@")
    api_host = api_cluster_name.partition("@")[2]
    api_node_host = api_node.partition("@")[2] if api_node else None
    for node in nodes:
        node_name, _, node_host = node.partition("@")
        if node_name != name or not host:
            continue
        if _short(node_host) == _short(host):
            return True
        if host == api_host and node_host == api_node_host:
            return True
    return False


class ManagementApi:
    """Talks to ``<base>/api`` (see the module docstring for where and as whom).

    ``amqp_url`` and ``management_url``: one URL, several joined by commas, or a list.
    With several APIs, the first that answers is used (``base`` names it once probed).
    """

    def __init__(
        self,
        amqp_url: str | SecretUrl | Sequence[str],
        management_url: str | SecretUrl | Sequence[str] | None = None,
        timeout: float = 3.0,
        *,
        ca_file: Path | None = None,
    ) -> None:
        amqp_urls = _listed(amqp_url)
        management_urls = _listed(management_url)
        self._locations = management_locations(amqp_urls, management_urls)
        self.configured = bool(management_urls)
        self.vhost = vhost_of(amqp_urls[0]) if amqp_urls else "/"
        self.timeout = timeout
        self._ca_file = ca_file
        self._use(0)
        self._problem: str | None = None
        self._checked = False

    @classmethod
    def for_settings(cls, settings: Settings, timeout: float = 3.0) -> ManagementApi:
        """The API of the settings' broker; an https one trusts ``tls_ca_file`` too."""
        return cls(settings.urls, settings.management_urls, timeout, ca_file=settings.tls_ca_file)

    @property
    def bases(self) -> list[str]:
        """Every API it tries, in order (no credentials: they can be shown)."""
        return [base for base, _, _ in self._locations]

    def _use(self, index: int) -> None:
        self.base, user, password = self._locations[index]
        self._auth = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._context = (
            ssl.create_default_context(cafile=str(self._ca_file))
            if self._ca_file and self.base.startswith("https:")
            else None
        )

    def get(self, path: str) -> Any:
        """GET ``/api/{path}`` and decode its JSON (of the first API that answers); a 5xx
        is tried again after each of :data:`GET_RETRY_PAUSES_S` (a GET changes nothing)."""
        for pause in GET_RETRY_PAUSES_S:
            try:
                return json.loads(self._call("GET", path))
            except urllib.error.HTTPError as exc:
                if exc.code < 500:
                    raise
            time.sleep(pause)
        return json.loads(self._call("GET", path))

    def _call(self, method: str, path: str, body: Any = None) -> bytes:
        """``method`` on ``/api/{path}``, ``body`` sent as JSON; the answer's bytes."""
        if not self._checked and len(self._locations) > 1:
            _ = self.problem  # choose the API first
        headers = {"Authorization": f"Basic {self._auth}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(
            f"{self.base}/api/{path}", data=data, method=method, headers=headers
        )
        with urllib.request.urlopen(request, timeout=self.timeout, context=self._context) as r:
            return bytes(r.read())

    @property
    def problem(self) -> str | None:
        """Why the API cannot be used (one line naming the URLs and the setting), or None."""
        if not self._checked:
            self._checked = True
            self._problem = self._probe_all()
        return self._problem

    @property
    def available(self) -> bool:
        return self.problem is None

    def _probe_all(self) -> str | None:
        """Use the first API that answers; else say why each did not."""
        whys: list[str] = []
        for index in range(len(self._locations)):
            self._use(index)
            why = self._probe()
            if why is None:
                return None
            whys.append(why)
        self._use(0)
        why = "; ".join(whys)
        if self.configured:
            return f"{why}; check {MANAGEMENT_URL_HINT}"
        return f"{why}; that is the default: set {MANAGEMENT_URL_HINT} to the broker's"

    def _probe(self) -> str | None:
        where = f"the management API at {self.base}"
        try:
            overview = self.get("overview")
        except urllib.error.HTTPError as exc:
            what = "refused the credentials" if exc.code in (401, 403) else "failed"
            return f"{where} {what} (HTTP {exc.code})"
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            return f"{where} is unreachable ({reason})"
        except ValueError:
            return f"{where} did not answer JSON: is it a management API?"
        if isinstance(overview, dict) and "rabbitmq_version" in overview:
            return None
        return f"{where} did not answer like RabbitMQ's management API"

    def send(self, method: str, path: str, body: Any = None) -> None:
        """PUT or DELETE ``/api/{path}`` with a JSON body: the x-delay bridge's policy, the
        one write rmqdelay makes through the API. Raises urllib's HTTPError."""
        self._call(method, path, body)

    def path(self, kind: str, name: str = "") -> str:
        """``kind/<vhost>/<name>``, each quoted, for :meth:`get` and :meth:`send`."""
        vhost = quote(self.vhost, safe="")
        return f"{kind}/{vhost}/{quote(name, safe='')}" if name else f"{kind}/{vhost}"

    def node_names(self) -> list[str]:
        """The cluster's nodes, or empty when this user may not list them (it needs the
        ``monitoring`` tag)."""
        try:
            found = self.get("nodes?columns=name")
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                return []
            raise
        return [str(n["name"]) for n in found if isinstance(n, dict) and "name" in n]

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
