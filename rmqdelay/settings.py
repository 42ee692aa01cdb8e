"""Configuration: flags over environment (``RMQDELAY_*``) over a TOML file.

Durations are stored as whole milliseconds, because RabbitMQ TTLs are.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    Secret,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from .core.durations import format_ms
from .core.layout import DEFAULT_JOURNAL_RETENTION, Layout, parse_size
from .errors import ConfigurationError
from .settings_light import (
    check_amqp_urls,
    check_management_urls,
    check_prefix,
    check_radix,
    check_resolution,
    layout_of,
    mask_url,
    read_config,
    split_url_text,
    to_ms,
    vhost_of,
)

__all__ = [
    "Milliseconds",
    "SecretUrl",
    "Settings",
    "load_settings",
    "mask_url",
    "reveal",
    "split_urls",
    "vhost_of",
]


class SecretUrl(Secret[str]):
    """One URL, or several joined by commas, whose password only an explicit call shows.

    pydantic's convention for a secret: ``str()``, ``repr()``, ``model_dump_json()`` and
    ``model_dump()`` (a ``SecretUrl`` still) show it masked (``amqp://u:***@host/%2F``);
    ``get_secret_value()`` gives the raw text, for connecting only.
    """

    def _display(self) -> str:
        return mask_url(self.get_secret_value())


def reveal(url: SecretUrl | str) -> str:
    """The raw text of a URL setting (a plain ``str`` is let through: ``model_copy``
    does not validate what it is given)."""
    return url.get_secret_value() if isinstance(url, SecretUrl) else url


def split_urls(url: SecretUrl | str | None) -> list[str]:
    """Each address of a URL setting, raw, in the order given."""
    if url is None:
        return []
    return split_url_text(reveal(url))


def _joiner(setting: str, kind: str) -> Any:
    def join(value: Any) -> Any:
        """Several addresses: a list (TOML, or JSON in the environment) or commas."""
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                why = f"{setting} looks like a JSON list but is not valid JSON"
                raise ValueError(why) from None
        if isinstance(value, (list, tuple)):
            if not value or not all(isinstance(v, (str, SecretUrl)) for v in value):
                raise ValueError(f"{setting} must be one {kind} URL or a non-empty list of them")
            return ",".join(reveal(v).strip() for v in value)
        return value

    return join


Urls = Annotated[SecretUrl, BeforeValidator(_joiner("url", "AMQP"))]
"""One AMQP URL, or several (a cluster's nodes) joined by commas; shown masked."""

ManagementUrls = Annotated[SecretUrl | None, BeforeValidator(_joiner("management_url", "HTTP"))]
"""One management API URL, or several joined by commas; shown masked."""

Milliseconds = Annotated[int, BeforeValidator(to_ms)]
"""Whole milliseconds, given as ``"10ms"``, seconds, or a timedelta."""
Bytes = Annotated[int, BeforeValidator(parse_size)]
"""A size in bytes, given as an int or ``"2GiB"``, ``"500MB"``."""
_TEN_MS: Any = "10ms"


class Settings(BaseSettings):
    """Everything rmqdelay needs to know; the delay layout is derived from it."""

    model_config = SettingsConfigDict(
        env_prefix="RMQDELAY_",
        extra="forbid",
        validate_default=True,
        frozen=True,
        hide_input_in_errors=True,  # a bad field must not print the URL's password
    )

    url: Urls = Field(SecretUrl("amqp://guest:guest@localhost:5672/%2F"), repr=False)
    """AMQP URL; ``amqps://`` for TLS. Several (a cluster's nodes): a list, or commas,
    all naming one virtual host. Clients try them in ``url_order`` at every connect and
    reconnect. A :class:`SecretUrl`: shown masked, raw by ``get_secret_value()``."""
    url_order: Literal["ordered", "shuffled"] = "ordered"
    """``shuffled`` spreads clients over the nodes; ``ordered`` prefers the first."""
    management_url: ManagementUrls = Field(None, repr=False)
    """Management API, of any node of the cluster; several (a list, or commas) are tried
    in order until one answers. Default: ``http(s)://<host>:15672`` of each AMQP URL.
    Its credentials, if any, win over the AMQP URL's. A :class:`SecretUrl`, like ``url``."""
    prefix: str = "rmqdelay"
    resolution: Milliseconds = Field(_TEN_MS, description="delays round up to this")
    radix: int = 16
    positions: int | None = None
    max_delay: Milliseconds | None = None
    named_tiers: list[Milliseconds] = Field(default_factory=list)
    queue_type: Literal["quorum", "classic"] = "quorum"
    delivery_limit: int = Field(20, ge=1)
    queue_leader_locator: Literal["balanced", "client-local", "none"] = "balanced"
    """Where a new quorum queue's leader goes: ``balanced`` spreads them over the
    cluster's nodes; ``none`` declares no locator (as rmqdelay 0.1 did)."""
    quorum_group_size: int | None = Field(None, ge=1)
    """Replicas of each new quorum queue (``x-quorum-initial-group-size``); default: all."""
    schedule_journal: bool = True
    """Record every publish and cancel in the ``{prefix}.schedule`` stream: needed by
    ``scheduled list`` and ``cancel``; off saves one small write per publish."""
    journal_bodies: bool = True
    """Keep each body in its journal record: an earlier reschedule's copy is made of it."""
    journal_retention: Bytes = DEFAULT_JOURNAL_RETENTION
    """Bytes the journal's stream keeps, and its checkpoints' stream too (``2GiB``,
    ``500MB``): the state as of the latest checkpoint, and the records since. Old
    records are deleted as new ones are written, never while nothing writes."""
    destinations: list[str] = Field(default_factory=list)
    max_destination_length: int = Field(100, ge=1)
    confirm_timeout: float = Field(30.0, gt=0)
    connection_name: str = "rmqdelay"
    tls_ca_file: Path | None = None
    """CA bundle that signed the broker's certificate, for ``amqps://``."""
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    """A client certificate and key, when the broker asks for one."""
    dashboard_host: str = "127.0.0.1"
    """Where ``rmqdelay dashboard`` listens: loopback unless told otherwise; any other
    address needs ``dashboard_token`` or ``dashboard_user`` and ``dashboard_password``."""
    dashboard_port: int = Field(8088, ge=0, le=65535)
    dashboard_token: SecretStr | None = Field(None, repr=False)
    """A bearer token the dashboard asks for (``Authorization: Bearer``, or the login
    form); shown masked, like the URL."""
    dashboard_user: str | None = None
    dashboard_password: SecretStr | None = Field(None, repr=False)
    """HTTP basic authentication for the dashboard, with ``dashboard_user``."""
    dashboard_read_only: bool = False
    """The dashboard shows everything and refuses every action (cancel, reschedule, replay, ...)."""
    dashboard_state: Path | None = None
    """The file the dashboard keeps the schedule in (SQLite), so a restart reads only the
    journal since; default: ``~/.cache/rmqdelay/dashboard-<prefix>-<broker>.sqlite3``."""
    dashboard_worker_metrics: list[str] = Field(default_factory=list)
    """Workers' Prometheus metrics URLs (``rmqdelay worker --metrics-port``): the
    dashboard's overview shows their liveness and lateness; none: not shown."""

    @field_validator("url")
    @classmethod
    def _amqp_urls(cls, url: SecretUrl) -> SecretUrl:
        check_amqp_urls(split_urls(url))
        return url

    @field_validator("management_url")
    @classmethod
    def _management_http(cls, url: SecretUrl | None) -> SecretUrl | None:
        if url is None or not split_urls(url):
            return None
        check_management_urls(split_urls(url))
        return url

    @field_validator("tls_ca_file", "tls_cert_file", "tls_key_file")
    @classmethod
    def _tls_file_exists(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        # checked here, or ssl says only "[Errno 2] No such file or directory", no name
        if path is not None and not path.is_file():
            raise ValueError(f"{info.field_name} {str(path)!r} is not a file")
        return path

    @model_validator(mode="after")
    def _dashboard_login_pairs(self) -> Settings:
        if (self.dashboard_user is None) != (self.dashboard_password is None):
            raise ValueError(
                "dashboard_user and dashboard_password go together: set both, or neither"
            )
        return self

    @field_validator("radix")
    @classmethod
    def _radix_range(cls, radix: int) -> int:
        return check_radix(radix)

    @field_validator("resolution")
    @classmethod
    def _positive_resolution(cls, resolution: int) -> int:
        return check_resolution(resolution)

    @field_validator("prefix")
    @classmethod
    def _prefix_name(cls, prefix: str) -> str:
        return check_prefix(prefix)

    @field_validator("named_tiers")
    @classmethod
    def _named_unique(cls, tiers: list[int]) -> list[int]:
        if len(set(tiers)) != len(tiers):
            raise ValueError(f"named_tiers repeat a duration: {[format_ms(t) for t in tiers]}")
        if len(tiers) > 8:
            raise ValueError("at most 8 named tiers are supported")
        return sorted(tiers, reverse=True)

    @model_validator(mode="after")
    def _layout_fits(self) -> Settings:
        # Building the layout runs every check that needs more than one field.
        _ = self.layout
        return self

    @property
    def layout(self) -> Layout:
        """The delay layout these settings describe; callers take it once and pass it down.

        Cached by value, not on the instance: ``model_copy(update=...)`` copies the
        instance's attributes without validating, and must not keep a stale layout.
        """
        return layout_of(self)

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

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        toml_file = _CONFIG_FILE.get()
        if toml_file is not None:
            sources += (TomlConfigSettingsSource(settings_cls, toml_file=toml_file),)
        return sources


class _ConfigFile:
    """The TOML file of the current load; pydantic-settings asks for it per class."""

    path: Path | None = None

    def get(self) -> Path | None:
        return self.path


_CONFIG_FILE = _ConfigFile()


def load_settings(config: Path | str | None = None, **overrides: Any) -> Settings:
    """Load settings: ``overrides`` (flags) over ``RMQDELAY_*`` over the TOML ``config``.

    ``None`` overrides are dropped, so unset CLI flags fall through to the environment.
    """
    path = Path(config) if config is not None else None
    read_config(path)  # a missing or malformed file, refused naming it
    _CONFIG_FILE.path = path
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except SettingsError as exc:  # a list or a table in the environment that is not JSON
        field = re.search(r'field "(\w+)"', str(exc))
        name = f"RMQDELAY_{field.group(1).upper()}" if field else "an RMQDELAY_* variable"
        raise ConfigurationError(
            f"cannot read {name}: a list in the environment is written as JSON, e.g. "
            f'{name}=\'["first", "second"]\''
        ) from None
    finally:
        _CONFIG_FILE.path = None
