"""``rmqdelay dashboard``: serve the web dashboard (the ``dashboard`` extra)."""

from __future__ import annotations

from pathlib import Path

import click

from .options import Command, broker_options, epilog, friendly_errors, settings_from
from .output import err

__all__ = ["READ_ONLY", "dashboard_command"]

# rmqdelay.dashboard.READ_ONLY, spelled out: the dashboard is imported when the command
# runs, not for the help (a unit test keeps them equal)
READ_ONLY = "shows everything and refuses every action (cancel, reschedule, replay, ...)"

_EXTRA = (
    "the dashboard needs its extra (Starlette, uvicorn and Jinja2): from a clone, "
    "pip install -e '.[dashboard]'; from a wheel, "
    "pip install './rmqdelay-VERSION-py3-none-any.whl[dashboard]'"
)


@click.command(
    "dashboard",
    cls=Command,
    epilog=epilog(
        "Serves the overview, the scheduled, parked and recurring messages and their "
        "actions, each page with its JSON twin under /api. It listens on 127.0.0.1 "
        "unless told otherwise, and refuses any other address without a login: a token "
        "(--token, RMQDELAY_DASHBOARD_TOKEN, dashboard_token) or basic auth "
        f"(RMQDELAY_DASHBOARD_USER and RMQDELAY_DASHBOARD_PASSWORD). --read-only {READ_ONLY}. "
        "What an action may do is the broker user's permissions' call: a refused one says why.",
        "rmqdelay dashboard",
        "RMQDELAY_DASHBOARD_TOKEN=... rmqdelay dashboard --host 0.0.0.0 --port 8088",
        "rmqdelay dashboard --read-only --worker-metrics http://worker-1:9100/",
    ),
)
@click.option("--host", metavar="ADDRESS", help="Listen here. Env: RMQDELAY_DASHBOARD_HOST.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    metavar="PORT",
    help="Listen on this port (default 8088). Env: RMQDELAY_DASHBOARD_PORT.",
)
@click.option(
    "--token",
    metavar="TOKEN",
    help="Ask for this token (prefer the environment: a flag shows in ps). "
    "Env: RMQDELAY_DASHBOARD_TOKEN.",
)
@click.option(
    "--read-only",
    is_flag=True,
    default=None,
    help=f"The dashboard {READ_ONLY}. Env: RMQDELAY_DASHBOARD_READ_ONLY.",
)
@click.option(
    "--worker-metrics",
    multiple=True,
    metavar="URL",
    help="A worker's metrics URL (its --metrics-port); repeat. "
    "Env: RMQDELAY_DASHBOARD_WORKER_METRICS (a JSON list).",
)
@click.option(
    "--state",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Keep the schedule in this SQLite file, so a restart reads only the journal "
    "written since (default: in ~/.cache/rmqdelay; ':memory:' for none). "
    "Env: RMQDELAY_DASHBOARD_STATE.",
)
@broker_options
@friendly_errors
def dashboard_command(
    host: str | None,
    port: int | None,
    token: str | None,
    read_only: bool | None,
    worker_metrics: tuple[str, ...],
    state: Path | None,
    url: tuple[str, ...],
    prefix: str | None,
    config: Path | None,
) -> None:
    """Serve the web dashboard: the schedule, the tiers and the parked messages."""
    settings = settings_from(
        url,
        prefix,
        config,
        dashboard_host=host,
        dashboard_port=port,
        dashboard_token=token,
        dashboard_read_only=read_only,
        dashboard_worker_metrics=list(worker_metrics) or None,
        dashboard_state=state,
    )
    from ..dashboard.binding import check_bind

    access = check_bind(settings)  # before anything is imported or bound
    try:
        import uvicorn

        from ..dashboard.app import create_app
        from ..dashboard.schedule import state_path
    except ImportError as exc:
        raise click.ClickException(f"{_EXTRA} ({exc})") from None
    _log_actions()
    app = create_app(settings, access)
    where = settings.dashboard_host
    shown = f"[{where}]" if ":" in where else where
    err().print(
        f"rmqdelay dashboard on http://{shown}:{settings.dashboard_port}/ "
        f"({access.describe()}), broker {settings.masked_url}, "
        f"schedule kept in {state_path(settings)}",
        highlight=False,
    )
    uvicorn.run(
        app,
        host=where,
        port=settings.dashboard_port,
        log_level="warning",
        access_log=False,  # a query string could carry a filter's text; pages log actions
        server_header=False,
    )


def _log_actions() -> None:
    """The dashboard's own log (each action and its outcome, scrubbed of secrets) on
    stderr; uvicorn's access log stays off (a query string could carry anything)."""
    import logging

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log = logging.getLogger("rmqdelay.dashboard")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
