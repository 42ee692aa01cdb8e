"""How the dashboard answers a request: a page or its JSON twin, scrubbed of secrets.

A page's read becomes the page, or its JSON under ``/api``; a failure becomes a
readable error in either (:mod:`.refusals`: a refused permission says which). An
action's POST is checked first (:func:`~.security.check_post`: origin, CSRF token,
read-only mode) and its :class:`~.actions.Outcome` reported back. The login form is
here too. What each page reads and shows is :mod:`.app`'s.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from ..core.clock import iso_of_ms, now_ms
from ..core.durations import format_ms
from ..core.messages import jsonable
from ..settings import Settings
from .actions import Outcome
from .binding import Access, access_of
from .refusals import explain, is_bug, is_refusal, scrub
from .schedule import StillReading
from .security import (
    SESSION_COOKIE,
    Refused,
    check_post,
    csrf_token,
    local_target,
    session_value,
    token_ok,
)

__all__ = ["HERE", "Web", "ahead", "when"]

log = logging.getLogger("rmqdelay.dashboard")
HERE = Path(__file__).parent


def when(ms: int | None) -> str:
    """A time as a page shows it: ISO 8601 to the second."""
    return "-" if ms is None else iso_of_ms(ms, "seconds")


def ahead(ms: int | None) -> str:
    """How far a time is from now: ``in 5m`` or ``3s ago``."""
    if ms is None:
        return "-"
    span_ms = ms - now_ms()
    span = format_ms(max(1000, round(abs(span_ms), -3)))  # to the second: a page is read slowly
    return f"in {span}" if span_ms >= 0 else f"{span} ago"


class Web:
    """The dashboard's answers, whatever the page: its settings, its login, its
    templates."""

    def __init__(self, settings: Settings, access: Access | None = None) -> None:
        self.settings = settings
        self.access = access or access_of(settings)
        self.key = secrets.token_bytes(32)
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(["html"]),
        )
        self.templates.globals.update(when=when, ahead=ahead, fmt_ms=format_ms)

    def acted(self) -> None:
        """An action did what it was asked: what the pages read may have changed."""

    def render(
        self, request: Request, name: str, status_code: int = 200, **context: Any
    ) -> Response:
        context.update(
            request=request,
            csrf=csrf_token(request),
            read_only=self.access.read_only,
            prefix=self.settings.layout.prefix,
            broker=self.settings.masked_url,
        )
        html = self.templates.get_template(name).render(context)
        return HTMLResponse(scrub(html, self.settings, every=False), status_code=status_code)

    def answer(self, data: Any, status_code: int = 200) -> JSONResponse:
        """A JSON answer, scrubbed like a page (a secret must not leave either way)."""
        response = JSONResponse(data, status_code=status_code)
        response.body = scrub(bytes(response.body).decode(), self.settings, every=False).encode()
        response.headers["content-length"] = str(len(response.body))
        return response

    async def guarded(
        self, request: Request, work: Callable[[], Awaitable[dict[str, Any]]], page: str
    ) -> Response:
        """Run a page's read; answer its JSON twin under /api, else the page; a failure
        becomes a readable error in either (a refused permission says so)."""
        api = request.url.path.startswith("/api/")
        try:
            data = await work()
        except HTTPException:
            raise
        except StillReading as exc:  # the loop serves on: the page asks again shortly
            if api:
                response: Response = self.answer(
                    {"reading": str(exc), "records": exc.records, "loading": exc.loading}, 503
                )
            else:
                response = self.render(
                    request, "reading.html", 503, reading=str(exc), title="Reading the schedule"
                )
            response.headers["retry-after"] = "1"
            return response
        except Exception as exc:
            if is_bug(exc):
                log.exception("dashboard page %s failed", request.url.path)
            text = explain(exc, self.settings)
            code = 403 if is_refusal(exc) else 400 if isinstance(exc, ValueError) else 502
            return self._error(request, text, code)
        if api:
            return self.answer(jsonable(data))
        return self.render(request, page, 200, **data)

    async def act(
        self,
        request: Request,
        work: Callable[[Any], Awaitable[Outcome]],
        back: str,
    ) -> Response:
        """An action: the POST's checks, the work, its outcome reported back (a page,
        or JSON under /api); a refused permission says which."""
        try:
            form = await check_post(request, action=True, read_only=self.access.read_only)
        except Refused as exc:
            refusal = Outcome(False, exc.detail)
            return self._report(request, refusal, exc.status_code, back, "Refused")
        try:
            outcome = await work(form)
        except Exception as exc:
            if is_bug(exc):
                log.exception("dashboard action %s failed", request.url.path)
            code = 403 if is_refusal(exc) else 400
            outcome = Outcome(False, explain(exc, self.settings))
        else:
            code = 200
            self.acted()
        log.info("%s: %s", request.url.path, scrub(outcome.text, self.settings))
        return self._report(request, outcome, code, back, "Done" if outcome.ok else "Not done")

    def _report(
        self, request: Request, outcome: Outcome, code: int, back: str, title: str
    ) -> Response:
        if request.url.path.startswith("/api/"):
            return self.answer(outcome.to_json(), code)
        ok, text, form = outcome.ok, outcome.text, outcome.form
        return self.render(
            request,
            "result.html",
            code,
            ok=ok,
            text=text,
            back=back,
            title=title,
            form=form,
            action=request.url.path,
        )

    def _error(self, request: Request, text: str, code: int) -> Response:
        if request.url.path.startswith("/api/"):
            return self.answer({"error": text}, code)
        return self.render(request, "error.html", code, error=text, title="Error")

    async def refused(self, request: Request, exc: Exception) -> Response:
        """An HTTP error (404, a guard's refusal) as a page, or JSON under /api."""
        assert isinstance(exc, HTTPException)
        return self._error(request, exc.detail, exc.status_code)

    async def login_page(self, request: Request) -> Response:
        target = local_target(request.query_params.get("next"))
        return self.render(request, "login.html", next=target, title="Log in")

    async def login(self, request: Request) -> Response:
        form = await check_post(request, action=False, read_only=False)
        target = local_target(str(form.get("next", "/")))
        if not token_ok(self.access, str(form.get("token", ""))):
            return self.render(
                request, "login.html", 401, next=target, error="wrong token", title="Log in"
            )
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            SESSION_COOKIE,
            session_value(self.access, self.key),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response
