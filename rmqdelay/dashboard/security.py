"""The dashboard's guards: the login, cross-site request checks, and safe headers.

Every request but the static files and the login page must carry the token (a
``Bearer`` header, or the session cookie the login form sets) or the basic-auth
password, when the settings ask for one. Every POST must come from the dashboard's own
pages: its ``Origin`` (or ``Referer``) names this host, and it carries the CSRF token of
its cookie (a form field or the ``X-CSRF-Token`` header); a request authenticated by a
``Bearer`` header is a script's, not a browser's, and needs no CSRF token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from urllib.parse import quote, urlsplit

from starlette.datastructures import FormData, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import READ_ONLY
from .binding import Access

__all__ = [
    "CSRF_COOKIE",
    "SESSION_COOKIE",
    "Guard",
    "Refused",
    "check_post",
    "csrf_token",
    "local_target",
    "session_value",
    "token_ok",
]

CSRF_COOKIE = "rmqdelay_csrf"
SESSION_COOKIE = "rmqdelay_session"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "x-csrf-token"
_PUBLIC = ("/static/", "/login")
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


class Refused(HTTPException):
    """A request the guards refuse: its status and the reason, in words."""


def session_value(access: Access, key: bytes) -> str:
    """The session cookie's value: an HMAC of the token, never the token itself."""
    return hmac.new(key, (access.token or "").encode(), hashlib.sha256).hexdigest()


def _same(given: str, expected: str) -> bool:
    """Compared in constant time: a timing must not tell how much of a secret matched."""
    return hmac.compare_digest(given.encode(), expected.encode())


def token_ok(access: Access, token: str) -> bool:
    """Whether the login form's token is the dashboard's."""
    return access.token is not None and _same(token, access.token)


def local_target(target: str | None) -> str:
    """A redirect target on this site only: a path, never ``//host`` or a URL."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _basic_ok(access: Access, header: str) -> bool:
    if access.user is None or access.password is None:
        return False
    try:
        user, _, password = base64.b64decode(header, validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    return _same(user, access.user) & _same(password, access.password)


def _authenticated(access: Access, key: bytes, request: Request) -> str | None:
    """How the request proved who it is (``bearer``, ``basic``, ``session``), or None."""
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    scheme = scheme.lower()
    token = access.token
    if scheme == "bearer" and token_ok(access, value.strip()):
        return "bearer"
    if scheme == "basic" and _basic_ok(access, value.strip()):
        return "basic"
    cookie = request.cookies.get(SESSION_COOKIE)
    if token is not None and cookie is not None and _same(cookie, session_value(access, key)):
        return "session"
    return None


def csrf_token(request: Request) -> str:
    """The CSRF token of this browser (its cookie's, or the one this answer sets)."""
    return str(request.scope["state"]["csrf"])


class Guard:
    """ASGI middleware: the login, the CSRF cookie, and the safety headers."""

    def __init__(self, app: ASGIApp, access: Access, key: bytes) -> None:
        self.app = app
        self.access = access
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        state = scope.setdefault("state", {})
        given = request.cookies.get(CSRF_COOKIE, "")
        fresh = len(given) < 32
        state["csrf"] = secrets.token_urlsafe(32) if fresh else given
        path = scope["path"]
        public = path.startswith(_PUBLIC)
        how = _authenticated(self.access, self.key, request) if self.access.protected else "open"
        state["auth"] = how
        if how is None and not public:
            await self._ask_login(request)(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["content-security-policy"] = _CSP
                headers["x-frame-options"] = "DENY"
                headers["x-content-type-options"] = "nosniff"
                headers["referrer-policy"] = "same-origin"
                if not path.startswith("/static/"):
                    headers["cache-control"] = "no-store"
                if fresh:
                    headers.append(
                        "set-cookie",
                        f"{CSRF_COOKIE}={state['csrf']}; Path=/; HttpOnly; SameSite=Strict",
                    )
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _ask_login(self, request: Request) -> Response:
        path = request.url.path
        basic = {"www-authenticate": 'Basic realm="rmqdelay dashboard"'}
        headers = basic if self.access.user is not None else {}
        if path.startswith("/api/"):
            how = []
            if self.access.token is not None:
                how.append("an 'Authorization: Bearer <token>' header")
            if self.access.user is not None:
                how.append("basic auth")
            return JSONResponse(
                {"error": f"authentication needed: send {' or '.join(how)}"},
                status_code=401,
                headers=headers,
            )
        if self.access.token is not None and request.method == "GET":
            return RedirectResponse(f"/login?next={quote(path)}", status_code=303)
        return PlainTextResponse("authentication needed", status_code=401, headers=headers)


def _origin_of(value: str) -> str | None:
    parts = urlsplit(value)
    if not parts.scheme or not parts.netloc:
        return None
    return f"{parts.scheme}://{parts.netloc}".lower()


def same_origin(request: Request) -> bool:
    """Whether a POST comes from this host's pages: its Origin (or, without one, its
    Referer) names the host it was sent to. A request with neither is a script's."""
    own = f"{request.url.scheme}://{request.headers.get('host', '')}".lower()
    origin = request.headers.get("origin")
    if origin is not None:
        return origin != "null" and _origin_of(origin) == own
    referer = request.headers.get("referer")
    if referer is not None:
        return _origin_of(referer) == own
    return True


async def check_post(request: Request, *, action: bool, read_only: bool) -> FormData:
    """The checks of every POST, then its form: the origin, the CSRF token (unless a
    ``Bearer`` header authenticated it), and for an action, the read-only mode."""
    if not same_origin(request):
        raise Refused(403, "refused: a cross-site request (its Origin is not this dashboard)")
    form = await request.form()
    if request.scope["state"].get("auth") != "bearer":
        sent = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER) or ""
        cookie = request.cookies.get(CSRF_COOKIE, "")
        if not (isinstance(sent, str) and cookie and _same(sent, cookie)):
            raise Refused(
                403,
                "refused: the CSRF token is missing or stale (reload the page and try again; "
                "a script sends an 'Authorization: Bearer' header instead)",
            )
    if action and read_only:
        raise Refused(
            403,
            f"refused: the dashboard is read-only (--read-only, dashboard_read_only = true): "
            f"it {READ_ONLY}; start it without to act on messages",
        )
    return form
