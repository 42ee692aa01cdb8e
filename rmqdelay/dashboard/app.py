"""The dashboard's web application: pages and their JSON twins, on Starlette.

Every page ``/x`` has its JSON twin ``/api/x``; every action is a POST, checked by
:func:`~.security.check_post` (origin, CSRF token, read-only mode). Broker work runs on
Starlette's thread pool (pika's blocking publisher) or on the loop (the parked queue's
aio-pika); errors are answered in words, scrubbed of secrets (:mod:`.refusals`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, cast

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..core.clock import datetime_of_ms, iso_of_ms, ms_of_datetime, now_ms
from ..core.durations import format_ms
from ..settings import Settings
from . import actions
from .actions import Job, Jobs, Outcome
from .binding import Access, access_of
from .overview import StatusWatch, broker_facts, worker_health
from .pages import BUCKETS, PageQuery
from .refusals import explain, is_refusal, scrub
from .schedule import HISTORY_KINDS, PREVIEW_AFTER_S, ScheduleSource, StillReading, numbered
from .security import SESSION_COOKIE, Guard, Refused, check_post, csrf_token, session_value

__all__ = ["Dashboard", "create_app"]

log = logging.getLogger("rmqdelay.dashboard")
HERE = Path(__file__).parent
PAGE_SIZES = (20, 50, 100, 500)


def _when(ms: int | None) -> str:
    return "-" if ms is None else iso_of_ms(ms, "seconds")


def _in(ms: int | None) -> str:
    if ms is None:
        return "-"
    ahead = ms - now_ms()
    span = format_ms(max(1000, round(abs(ahead), -3)))  # to the second: a page is read slowly
    return f"in {span}" if ahead >= 0 else f"{span} ago"


class Dashboard:
    """One dashboard: its settings, its reads of the broker, its jobs and its pages."""

    def __init__(self, settings: Settings, access: Access | None = None) -> None:
        self.settings = settings
        self.access = access or access_of(settings)
        self.key = secrets.token_bytes(32)
        self.schedule = ScheduleSource(settings)
        self.status = StatusWatch(settings)
        self.jobs = Jobs()
        self.templates = Environment(
            loader=FileSystemLoader(HERE / "templates"),
            autoescape=select_autoescape(["html"]),
        )
        self.templates.globals.update(when=_when, ahead=_in, fmt_ms=format_ms)

    # ------------------------------------------------------------------ helpers

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
            if _is_bug(exc):
                log.exception("dashboard page %s failed", request.url.path)
            text = explain(exc, self.settings)
            code = 403 if is_refusal(exc) else 400 if isinstance(exc, ValueError) else 502
            if api:
                return self.answer({"error": text}, code)
            return self.render(request, "error.html", code, error=text, title="Error")
        if api:
            return self.answer(_jsonable(data))
        return self.render(request, page, 200, **data)

    async def act(
        self,
        request: Request,
        work: Callable[[Any], Awaitable[Outcome]],
        back: str,
    ) -> Response:
        """An action: the POST's checks, the work, its outcome reported back (a page,
        or JSON under /api); a refused permission says which."""
        api = request.url.path.startswith("/api/")
        try:
            form = await check_post(request, action=True, read_only=self.access.read_only)
        except Refused as exc:
            if api:
                return self.answer({"ok": False, "text": exc.detail}, exc.status_code)
            return self.render(
                request,
                "result.html",
                exc.status_code,
                ok=False,
                text=exc.detail,
                back=back,
                title="Refused",
            )
        try:
            outcome = await work(form)
        except Exception as exc:
            if _is_bug(exc):
                log.exception("dashboard action %s failed", request.url.path)
            code = 403 if is_refusal(exc) else 400
            outcome = Outcome(False, explain(exc, self.settings))
        else:
            code = 200
            self.schedule.changed()
        log.info("%s: %s", request.url.path, scrub(outcome.text, self.settings))
        if api:
            return self.answer(outcome.to_json(), code)
        return self.render(
            request,
            "result.html",
            code,
            ok=outcome.ok,
            text=outcome.text,
            back=back,
            title="Done" if outcome.ok else "Not done",
        )

    async def _warm(self) -> None:
        """The schedule read and sorted at start-up; a failure is the first page's to
        say (it tries again), so it is only logged here."""
        try:
            await self.schedule.warm(now_ms())
        except Exception as exc:
            log.info("the schedule is not read yet: %s", explain(exc, self.settings))

    # ------------------------------------------------------------------ overview

    async def overview_data(self) -> dict[str, Any]:
        status, stuck = await run_in_threadpool(self.status.snapshot)
        schedule: dict[str, Any] = {"problem": None, "by_destination": {}, "buckets": {}}
        try:
            now = now_ms()
            index = await self.schedule.index(now)
            schedule["by_destination"] = index.by_destination(now)
            schedule["buckets"] = index.due_buckets(now)
            schedule["note"] = self.schedule.note
        except StillReading as exc:
            schedule["problem"] = str(exc)
        except Exception as exc:
            schedule["problem"] = explain(exc, self.settings)
        try:
            broker = (await run_in_threadpool(broker_facts, self.settings)).__dict__
        except Exception as exc:
            broker = {"nodes": [], "journal_leader": None, "problem": explain(exc, self.settings)}
        urls = self.settings.dashboard_worker_metrics
        workers = await asyncio.gather(*(run_in_threadpool(worker_health, u) for u in urls))
        parked = status.parked_by_destination
        return {
            "title": "Overview",
            "status": status.to_json(),
            "tiers": [t for t in status.to_json()["tiers"] if t["messages"] or t["past_due"]],
            "stuck": [{**s.__dict__, "describe": s.describe()} for s in stuck],
            "schedule": schedule,
            "bucket_names": [name for name, _ in BUCKETS],
            "bucket_labels": [_bucket_label(name) for name, _ in BUCKETS],
            "parked_by_destination": None if parked is None else parked.destinations,
            "broker": broker,
            "workers": [w.to_json() for w in workers],
        }

    async def overview(self, request: Request) -> Response:
        return await self.guarded(request, self.overview_data, "overview.html")

    async def overview_panel(self, request: Request) -> Response:
        return await self.guarded(request, self.overview_data, "overview_panel.html")

    # ------------------------------------------------------------------ scheduled

    def _query(self, request: Request) -> PageQuery:
        p = request.query_params

        def text(name: str) -> str | None:
            value = p.get(name, "").strip()
            return value or None

        limit = int(p.get("limit", "50") or 50)
        if not 1 <= limit <= 1000:
            raise ValueError(f"limit must be from 1 to 1000, got {limit}")
        order = p.get("order", "soonest")
        if order not in ("soonest", "newest"):
            raise ValueError(f"order must be soonest or newest, got {order!r}")
        return PageQuery(
            destination=text("destination"),
            key=text("key"),
            message_id=text("id"),
            due_from_ms=_time_ms(text("due_from"), "due_from"),
            due_to_ms=_time_ms(text("due_to"), "due_to"),
            order=cast(Literal["soonest", "newest"], order),
            after=text("after"),
            limit=limit,
        )

    async def scheduled(self, request: Request) -> Response:
        async def work() -> dict[str, Any]:
            query = self._query(request)
            now = now_ms()
            # the first page does not wait for the store: it has a way of its own
            wait_s = PREVIEW_AFTER_S if query.first_soonest else None
            try:
                index = await self.schedule.index(now, wait_s=wait_s)
            except StillReading as reading:
                if not query.first_soonest:
                    raise
                return await self._first_page(request, query, reading, now)
            page = index.page(query, now)
            rows = [
                {
                    **_record_json(row.record),
                    "copy": row.copy,
                    "copies": row.copies,
                }
                for row in numbered(index, page.rows, now)
            ]
            return {
                "title": "Scheduled",
                "rows": rows,
                "next_cursor": page.next_cursor,
                "total": page.total,
                "filters": dict(request.query_params),
                "page_sizes": PAGE_SIZES,
                "destinations": index.destinations(),
                "note": self.schedule.note,
            }

        return await self.guarded(request, work, "scheduled.html")

    async def _first_page(
        self, request: Request, query: PageQuery, reading: StillReading, now: int
    ) -> dict[str, Any]:
        """The first page while the schedule is first read: as ``scheduled list --limit``
        reads it; counts, filters and further pages once the store is in."""
        rows = await self.schedule.preview(query.limit, now)
        return {
            "title": "Scheduled",
            "rows": [{**_record_json(r), "copy": 1, "copies": 1} for r in rows],
            "next_cursor": None,
            "total": None,
            "filters": dict(request.query_params),
            "page_sizes": PAGE_SIZES,
            "destinations": [],
            "note": (
                f"{reading}: the first {query.limit} are read from the latest checkpoint "
                "and the journal after it; counts, filters and the next pages come once "
                "the schedule is read"
            ),
            "reading": True,
        }

    async def message(self, request: Request) -> Response:
        message_id = request.path_params["message_id"]

        async def work() -> dict[str, Any]:
            now = now_ms()
            index = await self.schedule.index(now)
            view = index.view_of(message_id)
            copies = view.copies_of(message_id)
            history = [r for r in index.history(message_id) if r.kind in HISTORY_KINDS]
            if not copies and not history:
                raise HTTPException(
                    404, f"no record of message {message_id!r} in the schedule journal"
                )
            answer, _last = view.answer(message_id, now)
            return {
                "title": f"Message {message_id}",
                "message_id": message_id,
                "copies": [
                    {
                        **_record_json(r, bodies=True),
                        "state": _copy_state(view, r, now),
                    }
                    for r in copies
                ],
                "history": [_record_json(r) for r in history],
                "pending": answer == "cancelled"
                and any(_copy_state(view, r, now) == "pending" for r in copies),
            }

        return await self.guarded(request, work, "message.html")

    async def cancel(self, request: Request) -> Response:
        message_id = request.path_params["message_id"]

        async def work(_form: Any) -> Outcome:
            return await run_in_threadpool(actions.cancel, self.settings, message_id)

        return await self.act(request, work, f"/scheduled/{message_id}")

    async def reschedule(self, request: Request) -> Response:
        message_id = request.path_params["message_id"]

        async def work(form: Any) -> Outcome:
            mode = str(form.get("mode", ""))
            if mode not in ("now", "plus1h", "at"):
                raise ValueError("choose how to reschedule: now, +1h, or a new time")
            at_ms = None  # now
            if mode == "plus1h":  # an hour after the latest copy still ahead
                now = now_ms()
                view = (await self.schedule.index(now)).view_of(message_id)
                ahead = [r.due_at_ms for r in view.copies_of(message_id) if r.due_at_ms > now]
                at_ms = max(ahead, default=now) + 3_600_000
            elif mode == "at":
                at_ms = _time_ms(str(form.get("at", "")).strip() or None, "the new time")
                if at_ms is None:
                    raise ValueError("give the new due time, e.g. 2026-12-01T09:00:00Z")
            at = None if at_ms is None else datetime_of_ms(at_ms)
            return await run_in_threadpool(actions.reschedule, self.settings, message_id, at)

        return await self.act(request, work, f"/scheduled/{message_id}")

    # ------------------------------------------------------------------ parked

    async def parked(self, request: Request) -> Response:
        destination = request.query_params.get("destination", "").strip() or None
        limit = int(request.query_params.get("limit", "100") or 100)

        async def work() -> dict[str, Any]:
            from ..amqp.parked_queue import ParkedQueue

            async with ParkedQueue(self.settings) as queue:
                total, items = await queue.list(destination, max(1, min(limit, 1000)))
            return {
                "title": "Parked",
                "total": total,
                "items": [_jsonable(item.to_json()) for item in items],
                "destination": destination or "",
            }

        return await self.guarded(request, work, "parked.html")

    async def _parked_job(self, request: Request, kind: Literal["replay", "purge"]) -> Response:
        api = request.url.path.startswith("/api/")
        started: list[Job] = []

        async def work(form: Any) -> Outcome:
            destination = str(form.get("destination", "")).strip() or None
            message_id = str(form.get("message_id", "")).strip() or None
            if kind == "purge" and form.get("confirm") != "yes":
                raise ValueError("a purge deletes messages for good: confirm it (confirm=yes)")
            what = f"{kind} of the parked messages"
            what += f" of {destination!r}" if destination else ""
            what += f" with id {message_id!r}" if message_id else ""
            job = self.jobs.new(what)
            started.append(job)
            run = actions.replay_parked if kind == "replay" else actions.purge_parked
            self.jobs.keep(
                asyncio.create_task(
                    self._run_job(job, run(self.settings, job, destination, message_id))
                )
            )
            return Outcome(True, f"started: {what}", {"job": job.id})

        response = await self.act(request, work, "/parked")
        if started and not api:
            return RedirectResponse(f"/jobs/{started[0].id}", status_code=303)
        return response

    async def _run_job(self, job: Job, work: Coroutine[Any, Any, Outcome]) -> None:
        try:
            job.outcome = await work
        except Exception as exc:
            if _is_bug(exc):
                log.exception("dashboard job %s failed", job.what)
            job.outcome = Outcome(False, explain(exc, self.settings))
        finally:
            job.done = True
            self.schedule.changed()
            self.status.parked_changed()
            log.info("job %s: %s", job.what, job.outcome.text if job.outcome else "?")

    async def replay(self, request: Request) -> Response:
        return await self._parked_job(request, "replay")

    async def purge(self, request: Request) -> Response:
        return await self._parked_job(request, "purge")

    async def job(self, request: Request) -> Response:
        job = self.jobs.get(request.path_params["job_id"])
        if job is None:
            raise HTTPException(404, "no such job (the dashboard was restarted?)")
        data = {"title": "Work in progress", "job": job.to_json()}
        if request.url.path.startswith("/api/"):
            return self.answer(data["job"])
        panel = request.url.path.endswith("/panel")
        return self.render(request, "job_panel.html" if panel else "job.html", 200, **data)

    # ------------------------------------------------------------------ recurring

    async def recurring(self, request: Request) -> Response:
        async def work() -> dict[str, Any]:
            now = now_ms()
            schedules = await self.schedule.recurring(now)
            return {
                "title": "Recurring",
                "note": self.schedule.note,
                "schedules": [
                    {**s.to_json(now), "timezone": _zone_of(s.rule.to_json())} for s in schedules
                ],
            }

        return await self.guarded(request, work, "recurring.html")

    async def recurring_action(self, request: Request) -> Response:
        name = request.path_params["name"]
        op = request.path_params["op"]

        async def work(_form: Any) -> Outcome:
            if op == "run":
                return await run_in_threadpool(actions.run_recurring_now, self.settings, name)
            if op not in ("pause", "resume"):
                raise ValueError(f"unknown action {op!r}: pause, resume or run")
            return await run_in_threadpool(
                actions.switch_recurring, self.settings, name, cast(Any, op)
            )

        return await self.act(request, work, "/recurring")

    # ------------------------------------------------------------------ login

    async def login_page(self, request: Request) -> Response:
        return self.render(
            request, "login.html", next=_local(request.query_params.get("next")), title="Log in"
        )

    async def login(self, request: Request) -> Response:
        form = await check_post(request, action=False, read_only=False)
        token = str(form.get("token", ""))
        target = _local(str(form.get("next", "/")))
        import hmac

        if self.access.token is None or not hmac.compare_digest(
            token.encode(), self.access.token.encode()
        ):
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

    # ------------------------------------------------------------------ the app

    def routes(self) -> list[Route | Mount]:
        page: list[tuple[str, Callable[[Request], Awaitable[Response]]]] = [
            ("/", self.overview),
            ("/overview/panel", self.overview_panel),
            ("/scheduled", self.scheduled),
            ("/scheduled/{message_id:path}", self.message),
            ("/parked", self.parked),
            ("/recurring", self.recurring),
            ("/jobs/{job_id}", self.job),
            ("/jobs/{job_id}/panel", self.job),
        ]
        routes: list[Route | Mount] = []
        for path, endpoint in page:
            routes.append(Route(path, endpoint, methods=["GET"]))
            api = "/api/overview" if path == "/" else f"/api{path}"
            if not path.endswith("/panel"):
                routes.append(Route(api, endpoint, methods=["GET"]))
        post: list[tuple[str, Callable[[Request], Awaitable[Response]]]] = [
            ("/scheduled/{message_id:path}/cancel", self.cancel),
            ("/scheduled/{message_id:path}/reschedule", self.reschedule),
            ("/parked/replay", self.replay),
            ("/parked/purge", self.purge),
            ("/recurring/{name:path}/{op}", self.recurring_action),
        ]
        for path, endpoint in post:
            routes.append(Route(path, endpoint, methods=["POST"]))
            routes.append(Route(f"/api{path}", endpoint, methods=["POST"]))
        # POST routes first: /scheduled/{id:path} would take /scheduled/x/cancel as an id
        ordered = [r for r in routes if "POST" in (getattr(r, "methods", None) or ())]
        ordered += [r for r in routes if r not in ordered]
        ordered += [
            Route("/login", self.login_page, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ]
        return ordered

    def app(self) -> Starlette:
        async def refused(request: Request, exc: Exception) -> Response:
            assert isinstance(exc, HTTPException)
            if request.url.path.startswith("/api/"):
                return self.answer({"error": exc.detail}, exc.status_code)
            return self.render(
                request, "error.html", exc.status_code, error=exc.detail, title="Error"
            )

        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            warming = asyncio.create_task(self._warm())
            try:
                yield
            finally:
                warming.cancel()
                await asyncio.gather(warming, return_exceptions=True)
                await self.schedule.close()

        return Starlette(
            lifespan=lifespan,
            routes=self.routes(),
            middleware=[Middleware(Guard, access=self.access, key=self.key)],
            exception_handlers={HTTPException: refused},
        )


def create_app(settings: Settings, access: Access | None = None) -> Starlette:
    """The dashboard's ASGI application for ``settings`` (what ``rmqdelay dashboard``
    serves; tests drive it with Starlette's TestClient)."""
    return Dashboard(settings, access).app()


def _is_bug(exc: Exception) -> bool:
    from ..errors import RmqDelayError

    return not isinstance(exc, (RmqDelayError, ValueError, OSError)) and not is_refusal(exc)


def _local(target: str | None) -> str:
    """A redirect target on this site only: a path, never ``//host`` or a URL."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _time_ms(text: str | None, what: str) -> int | None:
    """An ISO 8601 time with a timezone, or a duration from now (10m), in Unix ms: read
    as ``scheduled list --due-before`` reads it; ValueError naming the field."""
    from ..core.durations import parse_time_or_duration

    return None if text is None else ms_of_datetime(parse_time_or_duration(text, what))


def _record_json(record: Any, *, bodies: bool = False) -> dict[str, Any]:
    body = record.body
    data = {
        "kind": record.kind,
        "message_id": record.message_id,
        "destination": record.destination,
        "due_at_ms": record.due_at_ms,
        "due_at": _when(record.due_at_ms) if record.due_at_ms else None,
        "recorded_at_ms": record.recorded_at_ms,
        "recorded_at": _when(record.recorded_at_ms) if record.recorded_at_ms else None,
        "attempt": record.attempt,
        "key": record.key,
        "body_size": record.body_size,
        "worker": record.worker or None,
    }
    if bodies:
        data["headers"] = _jsonable(dict(record.headers))
        data["properties"] = _jsonable(dict(record.properties))
        data["body"] = None if body is None else body.decode("utf-8", "replace")
    return data


def _copy_state(view: Any, record: Any, now: int) -> str:
    if view.is_cancelled(record.message_id, record.due_at_ms):
        return "cancelled"
    if record.key is not None and view.hidden(record):
        return "replaced or ignored under its key"
    return "pending" if record.due_at_ms > now else "due"


def _bucket_label(name: str) -> str:
    return name if name == "later" else f"next {name}"


def _zone_of(rule: dict[str, Any]) -> str:
    zone = rule.get("tz") or rule.get("timezone")
    return str(zone) if zone else "UTC"


def _jsonable(value: Any) -> Any:
    """Plain JSON values: bytes as text, datetimes as ISO 8601, the rest as str."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, datetime):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
