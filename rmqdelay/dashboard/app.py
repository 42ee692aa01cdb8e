"""The dashboard's web application on Starlette: what each page reads and shows, what
each action does, the routes and the lifespan.

Every page ``/x`` has its JSON twin ``/api/x``; every action is a POST (how both are
answered, checked and logged is :mod:`.web`'s). Broker work runs on Starlette's thread
pool (pika's blocking publisher) or on the loop (the parked queue's aio-pika).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Literal, cast

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..core.clock import datetime_of_ms, now_ms
from ..core.journal.records import JournalRecord
from ..core.messages import jsonable
from ..settings import Settings
from . import actions
from .actions import Job, Jobs, Outcome
from .binding import Access
from .overview import StatusWatch, broker_facts, worker_health
from .pages import BUCKETS, PAGE_SIZES, query_of, time_ms
from .refusals import explain, is_bug
from .schedule import HISTORY_KINDS, PREVIEW_AFTER_S, ScheduleSource, StillReading, numbered
from .security import Guard
from .web import HERE, Web, log, when

__all__ = ["Dashboard", "create_app"]


class Dashboard(Web):
    """One dashboard: its settings, its reads of the broker, its jobs and its pages."""

    def __init__(self, settings: Settings, access: Access | None = None) -> None:
        super().__init__(settings, access)
        self.schedule = ScheduleSource(settings)
        self.status = StatusWatch(settings)
        self.jobs = Jobs()

    def acted(self) -> None:
        self.schedule.changed()

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
            "bucket_labels": [n if n == "later" else f"next {n}" for n, _ in BUCKETS],
            "parked_by_destination": None if parked is None else parked.destinations,
            "broker": broker,
            "workers": [w.to_json() for w in workers],
        }

    async def overview(self, request: Request) -> Response:
        return await self.guarded(request, self.overview_data, "overview.html")

    async def overview_panel(self, request: Request) -> Response:
        return await self.guarded(request, self.overview_data, "overview_panel.html")

    # ------------------------------------------------------------------ scheduled

    async def scheduled(self, request: Request) -> Response:
        async def work() -> dict[str, Any]:
            query = query_of(request.query_params)
            now = now_ms()
            data = {
                "title": "Scheduled",
                "filters": dict(request.query_params),
                "page_sizes": PAGE_SIZES,
            }
            # the first page does not wait for the store: it has a way of its own
            wait_s = PREVIEW_AFTER_S if query.first_soonest else None
            try:
                index = await self.schedule.index(now, wait_s=wait_s)
            except StillReading as reading:
                if not query.first_soonest:
                    raise
                # as ``scheduled list --limit`` reads it; counts, filters and further
                # pages once the store is in
                rows = await self.schedule.preview(query.limit, now)
                return data | {
                    "rows": [{**_record_json(r), "copy": 1, "copies": 1} for r in rows],
                    "next_cursor": None,
                    "total": None,
                    "destinations": [],
                    "note": (
                        f"{reading}: the first {query.limit} are read from the latest "
                        "checkpoint and the journal after it; counts, filters and the next "
                        "pages come once the schedule is read"
                    ),
                    "reading": True,
                }
            page = index.page(query, now)
            return data | {
                "rows": [
                    {**_record_json(row.record), "copy": row.copy, "copies": row.copies}
                    for row in numbered(index, page.rows, now)
                ],
                "next_cursor": page.next_cursor,
                "total": page.total,
                "destinations": index.destinations(),
                "note": self.schedule.note,
            }

        return await self.guarded(request, work, "scheduled.html")

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
            states = [
                index.verdict(r) or ("pending" if r.due_at_ms > now else "due") for r in copies
            ]
            return {
                "title": f"Message {message_id}",
                "message_id": message_id,
                "copies": [
                    {**_record_json(r, bodies=True), "state": state}
                    for r, state in zip(copies, states, strict=True)
                ],
                "history": [_record_json(r) for r in history],
                "pending": answer == "cancelled" and "pending" in states,
            }

        return await self.guarded(request, work, "message.html")

    async def cancel(self, request: Request) -> Response:
        message_id = request.path_params["message_id"]

        async def work(_form: Any) -> Outcome:
            return await run_in_threadpool(actions.cancel, self.settings, message_id)

        return await self.act(request, work, f"/scheduled/{message_id}")

    async def cancel_matching(self, request: Request) -> Response:
        async def work(form: Any) -> Outcome:
            fields = {k: str(form.get(k, "")) for k in actions.FILTERS}
            expected = str(form.get("expected", "")).strip()
            count = int(expected) if expected.isdigit() else None
            return await run_in_threadpool(actions.cancel_matching, self.settings, fields, count)

        return await self.act(request, work, "/scheduled")

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
                at_ms = time_ms(str(form.get("at", "")).strip() or None, "the new time")
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
                "items": [jsonable(item.to_json()) for item in items],
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
            what = f"{kind} of the parked messages{actions.which(destination, message_id)}"
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
            if is_bug(exc):
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
                    {**s.to_json(now), "timezone": s.rule.to_json().get("tz") or "UTC"}
                    for s in schedules
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
            ("/cancel-matching", self.cancel_matching),
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
            exception_handlers={HTTPException: self.refused},
        )


def create_app(settings: Settings, access: Access | None = None) -> Starlette:
    """The dashboard's ASGI application for ``settings`` (what ``rmqdelay dashboard``
    serves; tests drive it with Starlette's TestClient)."""
    return Dashboard(settings, access).app()


def _record_json(record: JournalRecord, *, bodies: bool = False) -> dict[str, Any]:
    body = record.body
    data = {
        "kind": record.kind,
        "message_id": record.message_id,
        "destination": record.destination,
        "due_at_ms": record.due_at_ms,
        "due_at": when(record.due_at_ms) if record.due_at_ms else None,
        "recorded_at_ms": record.recorded_at_ms,
        "recorded_at": when(record.recorded_at_ms) if record.recorded_at_ms else None,
        "attempt": record.attempt,
        "key": record.key,
        "body_size": record.body_size,
        "worker": record.worker or None,
    }
    if bodies:
        data["headers"] = jsonable(dict(record.headers))
        data["properties"] = jsonable(dict(record.properties))
        data["body"] = None if body is None else body.decode("utf-8", "replace")
    return data
