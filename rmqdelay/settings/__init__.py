"""Configuration: flags over environment (``RMQDELAY_*``) over a TOML file, read by one loader.

Every setting is declared once, as a field of :class:`Settings` (a frozen dataclass: its
type, default, reader and description). ``dataclasses.fields(Settings)`` lists them in
order, each with ``field.metadata["description"]``, for the settings reference. Plain
Python, no pydantic: reading the settings costs every command well under a millisecond,
and ``rmqdelay publish`` starts as fast as a raw pika script allows.

Durations are stored as whole milliseconds, because RabbitMQ TTLs are.
"""

# ruff: noqa: RUF009 (each field is made by setting(), which returns a dataclasses.field)
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from ..core.layout import DEFAULT_JOURNAL_RETENTION, Layout, parse_size
from ..errors import ConfigurationError
from . import readers as read
from .readers import SecretStr, SecretUrl, mask_url, reveal, split_urls, vhost_of

__all__ = [
    "SecretStr",
    "SecretUrl",
    "Settings",
    "SettingsError",
    "load_settings",
    "mask_url",
    "reveal",
    "split_urls",
    "vhost_of",
]


def setting(
    default: Any, reader: read.Reader, description: str, *, shown: bool = True, many: bool = False
) -> Any:
    """A field of :class:`Settings`: its default, how a given value is read, and the
    description the settings reference shows (``field.metadata["description"]``)."""
    meta = {"description": " ".join(description.split()), "read": reader}
    if many:
        return field(default_factory=list, metadata=meta, repr=shown)
    return field(default=default, metadata=meta, repr=shown)


@dataclass(frozen=True, init=False)
class Settings:
    """Everything rmqdelay needs to know; the delay layout is derived from it.

    ``Settings(**values)`` reads the ``RMQDELAY_*`` environment under the values given;
    :func:`load_settings` adds a TOML file under both. A value of the wrong form is
    refused with a :class:`SettingsError` naming every setting at fault.
    """

    url: SecretUrl = setting(
        SecretUrl("amqp://guest:guest@localhost:5672/%2F"),
        read.urls("url", "AMQP", read.check_amqp_urls),
        """AMQP URL; ``amqps://`` for TLS. Several (a cluster's nodes): a list, or commas,
        all naming one virtual host. Clients try them in ``url_order`` at every connect and
        reconnect. A :class:`SecretUrl`: shown masked, raw by ``get_secret_value()``.""",
        shown=False,
    )
    url_order: Literal["ordered", "shuffled"] = setting(
        "ordered",
        read.choice("ordered", "shuffled"),
        "``shuffled`` spreads clients over the nodes; ``ordered`` prefers the first.",
    )
    management_url: SecretUrl | None = setting(
        None,
        read.optional(read.urls("management_url", "HTTP", read.check_management_urls)),
        """Management API, of any node of the cluster; several (a list, or commas) are tried
        in order until one answers. Default: ``http(s)://<host>:15672`` of each AMQP URL.
        Its credentials, if any, win over the AMQP URL's. A :class:`SecretUrl`, like ``url``.""",
        shown=False,
    )
    prefix: str = setting("rmqdelay", read.prefix_name, "Prefix of every exchange and queue.")
    resolution: int = setting(
        10, read.resolution, "Delays round up to a multiple of this (whole milliseconds)."
    )
    radix: int = setting(16, read.radix, "2 to 16; more tiers, fewer hops.")
    positions: int | None = setting(
        None,
        read.optional(read.integer),
        "The number of digit positions, instead of ``max_delay``; default: derived.",
    )
    max_delay: int | None = setting(
        None,
        read.optional(read.duration_ms),
        "The longest delay accepted; sets the positions (default: 366 days).",
    )
    named_tiers: list[int] = setting(
        None,
        read.tiers,
        'One-hop tiers, e.g. ``["15m", "1h"]`` (a JSON list in the environment).',
        many=True,
    )
    queue_type: Literal["quorum", "classic"] = setting(
        "quorum", read.choice("quorum", "classic"), "``quorum`` or ``classic``."
    )
    delivery_limit: int = setting(
        20,
        read.at_least(read.integer, 1),
        "Quorum work queues park a message redelivered more often.",
    )
    queue_leader_locator: Literal["balanced", "client-local", "none"] = setting(
        "balanced",
        read.choice("balanced", "client-local", "none"),
        """Where a new quorum queue's leader goes: ``balanced`` spreads them over the
        cluster's nodes; ``none`` declares no locator (as rmqdelay 0.1 did).""",
    )
    quorum_group_size: int | None = setting(
        None,
        read.optional(read.at_least(read.integer, 1)),
        "Replicas of each new quorum queue (``x-quorum-initial-group-size``); default: all.",
    )
    schedule_journal: bool = setting(
        True,
        read.boolean,
        """Record every publish and cancel in the ``{prefix}.schedule`` stream: needed by
        ``scheduled list`` and ``cancel``; off saves one small write per publish.""",
    )
    journal_linger: int = setting(
        20,
        read.duration_ms,
        """The shortest time between two journal writes of an asyncio publisher: a record
        that comes sooner after the last write waits for the rest of it and goes with the
        records that came meanwhile, as one stream write (each write costs the broker a
        write and a read by every worker, whatever it holds); the messages do not wait.
        A record after a quiet linger goes at once, and so does that of a caller awaiting
        each publish in turn. 0: a write per publish. The blocking publisher writes a
        batch's records at once. A duration (``20ms``; a bare number is seconds, as for
        every duration).""",
    )
    journal_bodies: bool = setting(
        True,
        read.boolean,
        "Keep each body in its journal record: an earlier reschedule's copy is made of it.",
    )
    journal_retention: int = setting(
        DEFAULT_JOURNAL_RETENTION,
        lambda value: read.integer(parse_size(value)),
        """Bytes the journal's stream keeps, and its checkpoints' stream too (``2GiB``,
        ``500MB``): the state as of the latest checkpoint, and the records since. Old
        records are deleted as new ones are written, never while nothing writes.""",
    )
    destinations: list[str] = setting(
        None,
        read.list_of(read.text),
        "Destinations that ``topology`` commands always include.",
        many=True,
    )
    held_destinations: list[str] = setting(
        None,
        read.list_of(read.text),
        """Destinations whose consumers are all rmqdelay's (``Worker``, ``rmqdelay consume``,
        the bridge): ``topology apply`` marks them held, publishers skip their last digits,
        and the consumer waits out up to ``hold_window`` itself. A plain AMQP consumer of
        one would get messages early.""",
        many=True,
    )
    hold_window: int | None = setting(
        None,
        read.optional(read.duration_ms),
        """How early a held destination's messages may arrive: the resolution times a
        power of the radix times a divisor of the radix; default: the largest such not over 6 s
        (5.12 s).""",
    )
    max_held: int = setting(
        5000,
        read.at_least(read.integer, 1),
        """The most messages a consumer holds for a held destination before their due
        time; then it takes no more until some are due (its prefetch is its concurrency
        plus this).""",
    )
    max_destination_length: int = setting(
        100, read.at_least(read.integer, 1), "Longest destination name, in bytes."
    )
    confirm_timeout: float = setting(
        30.0,
        read.at_least(read.number, 0, strict=True),
        "Seconds to wait for a publisher confirm.",
    )
    connection_name: str = setting(
        "rmqdelay", read.text, "Shown in the management UI, suffixed by role."
    )
    tls_ca_file: Path | None = setting(
        None,
        read.tls_file("tls_ca_file"),
        "CA bundle that signed the broker's certificate, for ``amqps://``.",
    )
    tls_cert_file: Path | None = setting(
        None,
        read.tls_file("tls_cert_file"),
        "A client certificate, when the broker asks for one (with ``tls_key_file``).",
    )
    tls_key_file: Path | None = setting(
        None, read.tls_file("tls_key_file"), "The key of ``tls_cert_file``."
    )
    dashboard_host: str = setting(
        "127.0.0.1",
        read.text,
        """Where ``rmqdelay dashboard`` listens: loopback unless told otherwise; any other
        address needs ``dashboard_token`` or ``dashboard_user`` and ``dashboard_password``.""",
    )
    dashboard_port: int = setting(
        8088,
        read.at_least(read.integer, 0, high=65535),
        "The port ``rmqdelay dashboard`` listens on.",
    )
    dashboard_token: SecretStr | None = setting(
        None,
        read.optional(read.secret),
        """A bearer token the dashboard asks for (``Authorization: Bearer``, or the login
        form); shown masked, like the URL.""",
        shown=False,
    )
    dashboard_user: str | None = setting(
        None,
        read.optional(read.text),
        "HTTP basic authentication for the dashboard: the user, with ``dashboard_password``.",
    )
    dashboard_password: SecretStr | None = setting(
        None,
        read.optional(read.secret),
        "HTTP basic authentication for the dashboard, with ``dashboard_user``.",
        shown=False,
    )
    dashboard_read_only: bool = setting(
        False,
        read.boolean,
        "The dashboard shows everything and refuses every action (cancel, reschedule, "
        "replay, ...).",
    )
    dashboard_state: Path | None = setting(
        None,
        read.optional(read.path_of),
        """The file the dashboard keeps the schedule in (SQLite), so a restart reads only the
        journal since; default: ``~/.cache/rmqdelay/dashboard-<prefix>-<broker>.sqlite3``.""",
    )
    dashboard_worker_metrics: list[str] = setting(
        None,
        read.list_of(read.text),
        """Workers' Prometheus metrics URLs (``rmqdelay worker --metrics-port``): the
        dashboard's overview shows their liveness and lateness; none: not shown.""",
        many=True,
    )

    def __init__(self, **values: Any) -> None:
        _fill(self, {**_environment(), **values})

    def replace(self, **changes: Any) -> Settings:
        """A copy with *changes*, read as the constructor reads them; the rest kept as is."""
        copy = object.__new__(Settings)
        copy.__dict__.update(self.__dict__)
        _fill(copy, changes, base=False)
        return copy

    def as_dict(self) -> dict[str, Any]:
        """Every setting's value; secrets stay :class:`SecretStr` (shown masked)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def to_json(self) -> str:
        """The settings as JSON, secrets masked."""
        return json.dumps(self.as_dict(), default=str)

    @property
    def layout(self) -> Layout:
        """The delay layout these settings describe; callers take it once and pass it down."""
        return _build_layout(
            prefix=self.prefix,
            resolution_ms=self.resolution,
            radix=self.radix,
            positions=self.positions,
            max_delay_ms=self.max_delay,
            named_tiers_ms=tuple(self.named_tiers),
            max_destination_length=self.max_destination_length,
            queue_type=self.queue_type,
            delivery_limit=self.delivery_limit,
            journal=self.schedule_journal,
            journal_retention=self.journal_retention,
            leader_locator=None
            if self.queue_leader_locator == "none"
            else self.queue_leader_locator,
            quorum_group_size=self.quorum_group_size,
            hold_window_ms=self.hold_window,
        )

    @property
    def urls(self) -> list[str]:
        """Each broker address, raw (with its password: for connecting only), in order."""
        return split_urls(self.url)

    @property
    def management_urls(self) -> list[str]:
        """Each management API address given, raw; empty when none is (the default)."""
        return split_urls(self.management_url)

    @property
    def vhost(self) -> str:
        """The virtual host every URL names."""
        return vhost_of(self.urls[0])

    @property
    def masked_url(self) -> str:
        return mask_url(reveal(self.url))


_build_layout = lru_cache(maxsize=64)(Layout.build)
_FIELDS = {f.name: f for f in fields(Settings)}


class SettingsError(ConfigurationError):
    """Settings refused: each wrong setting with what is wrong, never a secret's value."""

    def __init__(self, problems: list[tuple[tuple[str | int, ...], str]]) -> None:
        self.problems = problems
        said = "; ".join(f"{'.'.join(map(str, loc)) or 'settings'}: {msg}" for loc, msg in problems)
        super().__init__(f"invalid settings: {said}")

    def errors(self) -> list[dict[str, Any]]:
        """Each problem as ``{"loc": (setting, ...), "msg": text}``."""
        return [{"loc": loc, "msg": msg} for loc, msg in self.problems]


def _fill(settings: Settings, given: dict[str, Any], *, base: bool = True) -> None:
    """Read *given* into *settings* (the defaults under them when *base*), check what
    needs several settings, or raise one :class:`SettingsError` naming every fault."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for name, spec in _FIELDS.items():
        if name not in given and not base:
            continue
        try:
            value = spec.metadata["read"](given[name]) if name in given else _default(name)
        except read.ItemError as exc:
            problems.append(((name, exc.index), str(exc)))
        except ValueError as exc:
            problems.append(((name,), str(exc)))
        else:
            object.__setattr__(settings, name, value)
    problems += [
        ((name,), "Extra inputs are not permitted") for name in given if name not in _FIELDS
    ]
    if not problems:
        try:
            if (settings.dashboard_user is None) != (settings.dashboard_password is None):
                raise ValueError(
                    "dashboard_user and dashboard_password go together: set both, or neither"
                )
            _ = settings.layout  # every check of the layout, which needs several settings
        except ValueError as exc:
            problems.append(((), str(exc)))
    if problems:
        raise SettingsError(problems)


def _default(name: str) -> Any:
    spec = _FIELDS[name]
    return [] if spec.default_factory is list else spec.default


def _environment() -> dict[str, Any]:
    """The ``RMQDELAY_*`` variables of settings, names in any case; a list's is JSON."""
    variables = {key.lower(): value for key, value in os.environ.items()}
    found: dict[str, Any] = {}
    for name, spec in _FIELDS.items():  # in order: the first list that is not JSON is named
        value = variables.get(f"rmqdelay_{name}")
        if value is None:
            continue
        if spec.default_factory is not list:
            found[name] = value
            continue
        try:
            found[name] = json.loads(value)
        except json.JSONDecodeError:
            variable = f"RMQDELAY_{name.upper()}"
            raise ConfigurationError(
                f"cannot read {variable}: a list in the environment is written as JSON, "
                f'e.g. {variable}=\'["first", "second"]\''
            ) from None
    return found


def _read_config(path: Path) -> dict[str, Any]:
    """The TOML file's table; a missing or malformed file is refused naming it."""
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist")
    # imported here: most runs read no file
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]
    try:
        table: dict[str, Any] = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"config file {str(path)!r} is not valid TOML: {exc}") from None
    return table


def load_settings(config: Path | str | None = None, **overrides: Any) -> Settings:
    """Load settings: ``overrides`` (flags) over ``RMQDELAY_*`` over the TOML ``config``.

    ``None`` overrides are dropped, so unset CLI flags fall through to the environment.
    """
    table = _read_config(Path(config)) if config is not None else {}
    settings = object.__new__(Settings)
    flags = {k: v for k, v in overrides.items() if v is not None}
    _fill(settings, {**table, **_environment(), **flags})
    return settings
