"""Where the dashboard may listen: loopback freely, anywhere else only behind a login.

Checked before anything is imported or bound, so a refusal costs nothing and names the
setting to change.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from ..errors import ConfigurationError
from ..settings import Settings

__all__ = ["Access", "access_of", "check_bind", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    name = host.strip().strip("[]").lower()
    if name in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


@dataclass(frozen=True)
class Access:
    """Who may use the dashboard: the secrets are kept as given, never shown."""

    token: str | None
    user: str | None
    password: str | None
    read_only: bool

    @property
    def protected(self) -> bool:
        return self.token is not None or self.user is not None

    def describe(self) -> str:
        """How the dashboard is protected, in words a log line may carry (no secret)."""
        ways = []
        if self.token is not None:
            ways.append("a token")
        if self.user is not None:
            ways.append(f"basic auth as {self.user!r}")
        how = " or ".join(ways) if ways else "no login (loopback only)"
        return how + (", read-only" if self.read_only else "")


def access_of(settings: Settings) -> Access:
    """The login the settings ask for; an empty token or password counts as none."""
    token = settings.dashboard_token.get_secret_value() if settings.dashboard_token else None
    password = (
        settings.dashboard_password.get_secret_value() if settings.dashboard_password else None
    )
    user = settings.dashboard_user or None
    if not password:
        user, password = None, None
    return Access(token or None, user, password, settings.dashboard_read_only)


def check_bind(settings: Settings) -> Access:
    """Refuse a non-loopback address without a login; the access to enforce otherwise."""
    access = access_of(settings)
    host = settings.dashboard_host
    if not is_loopback(host) and not access.protected:
        raise ConfigurationError(
            f"refusing to serve the dashboard on {host!r} without authentication: anyone "
            "who can reach it could cancel and purge messages. Set dashboard_token "
            "(--token, RMQDELAY_DASHBOARD_TOKEN) or dashboard_user and dashboard_password "
            "(RMQDELAY_DASHBOARD_USER, RMQDELAY_DASHBOARD_PASSWORD), or listen on "
            "127.0.0.1 (--host)"
        )
    return access
