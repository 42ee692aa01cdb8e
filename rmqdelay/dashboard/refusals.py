"""Errors in words an operator can act on, without any secret in them.

A refused permission (``ACCESS_REFUSED``, a 403 of the management API) says which
permission the broker user lacks; every text goes through :func:`scrub`, which masks
URLs and removes the configured passwords and tokens should a library quote one.
"""

from __future__ import annotations

import sys
import urllib.error
from urllib.parse import unquote, urlsplit

from ..errors import AccessRefusedError, RmqDelayError
from ..settings import Settings, mask_url

__all__ = ["explain", "explain_text", "is_bug", "is_refusal", "scrub"]

_PERMISSIONS = (
    "the broker user lacks the permission for this (ACCESS_REFUSED): {detail}. "
    "Grant it (rabbitmqctl set_permissions: write on the prefix's exchanges and the "
    "schedule journal, read and write on the parking queue), or run the dashboard as "
    "another user"
)


_SAID = (RmqDelayError, ValueError, OSError)
"""Errors a user or the broker caused, said in their own words (any other is a bug)."""

_SHORTEST_SCRUBBED = 8
"""Pages and API answers are scrubbed of secrets this long or longer: a shorter one
(``guest``) could be part of an id shown, and mangle its links. Error texts are
scrubbed of every secret."""


def _secrets(settings: Settings, shortest: int = 1) -> set[str]:
    found: set[str] = set()
    for url in [*settings.urls, *settings.management_urls, *settings.dashboard_worker_metrics]:
        password = urlsplit(url).password
        if password:
            found |= {password, unquote(password)}
    for secret in (settings.dashboard_token, settings.dashboard_password):
        if secret is not None and secret.get_secret_value():
            found.add(secret.get_secret_value())
    return {s for s in found if len(s) >= shortest}


def scrub(text: str, settings: Settings, *, every: bool = True) -> str:
    """``text`` with URLs masked and no configured password or token left in it.
    ``every=False``, for a whole page: no secret of 8 characters or more, and URLs left
    as they are (a page's links and ``@`` would confuse the masking: what a page shows
    of a URL is masked when rendered)."""
    if every and "://" in text:
        text = mask_url(text)
    shortest = 1 if every else _SHORTEST_SCRUBBED
    for secret in sorted(_secrets(settings, shortest), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def is_refusal(exc: BaseException) -> bool:
    """Whether the broker refused the user a permission (rather than failing)."""
    if isinstance(exc, AccessRefusedError):
        return True
    if isinstance(exc, urllib.error.HTTPError) and exc.code in (401, 403):
        return True
    if "pika" in sys.modules:
        import pika.exceptions

        if isinstance(exc, pika.exceptions.ChannelClosedByBroker) and exc.reply_code == 403:
            return True
    if "aiormq" in sys.modules:
        import aiormq.exceptions

        if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
            return True
    cause = exc.__cause__ or exc.__context__
    return "ACCESS_REFUSED" in str(exc) or (cause is not None and is_refusal(cause))


def is_bug(exc: BaseException) -> bool:
    """Whether an error is the dashboard's own (logged with its traceback), not one the
    broker or a user caused."""
    return not isinstance(exc, _SAID) and not is_refusal(exc)


def _detail(exc: BaseException) -> str:
    if isinstance(exc, AccessRefusedError):
        return exc.detail
    if isinstance(exc, urllib.error.HTTPError):
        return f"the management API answered {exc.code} {exc.reason}"
    reply = getattr(exc, "reply_text", None)
    if isinstance(reply, str) and reply:
        return reply
    if exc.args:
        return " ".join(str(a) for a in exc.args)
    return type(exc).__name__


def explain(exc: BaseException, settings: Settings) -> str:
    """One line for an error the broker or a user caused, scrubbed of secrets."""
    if is_refusal(exc):
        text = _PERMISSIONS.format(detail=_detail(exc))
    elif isinstance(exc, _SAID):
        text = str(exc) or type(exc).__name__
    else:
        text = f"{type(exc).__name__}: {_detail(exc)}"
    return scrub(text, settings)


def explain_text(text: str, settings: Settings) -> str:
    """A reason already in words (a replay's skipped message): the permission it lacks
    said first when the broker refused one."""
    if "ACCESS_REFUSED" in text:
        text = _PERMISSIONS.format(detail=text)
    return scrub(text, settings)
