"""Settings without pydantic: the checks :class:`~rmqdelay.settings.Settings` runs, and a
light loader for ``rmqdelay publish``.

Importing pydantic and pydantic-settings and building the settings model took about
half of ``rmqdelay publish``'s start-up. :func:`load_light_settings` reads the same
sources with the same precedence (flags over ``RMQDELAY_*`` over the TOML file over the
defaults) and runs the same checks (the functions below, which the model's validators
call too). It takes only the plain, valid case: a value it does not read exactly as the
model would (a list, an unknown key, a form it is not sure of) or that a check refuses
sends the whole load to :func:`~rmqdelay.settings.load_settings`, so every error a user
sees is the model's own message, word for word.

The broker code takes either, through :class:`BrokerSettings`.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import SplitResult, unquote, urlsplit

from .core.durations import parse_duration_us
from .core.layout import DEFAULT_JOURNAL_RETENTION, Layout, parse_size
from .errors import ConfigurationError, DelayError

if TYPE_CHECKING:
    from .settings import Settings

__all__ = [
    "BrokerSettings",
    "LightSettings",
    "check_amqp_urls",
    "check_management_urls",
    "check_prefix",
    "check_radix",
    "check_resolution",
    "load_light_settings",
    "mask_url",
    "read_config",
    "to_ms",
    "vhost_of",
]


class BrokerSettings(Protocol):
    """What the publishers and the connection code read of the settings: a
    :class:`~rmqdelay.settings.Settings` or a :class:`LightSettings`."""

    @property
    def url_order(self) -> Literal["ordered", "shuffled"]: ...
    @property
    def confirm_timeout(self) -> float: ...
    @property
    def connection_name(self) -> str: ...
    @property
    def journal_bodies(self) -> bool: ...
    @property
    def tls_ca_file(self) -> Path | None: ...
    @property
    def tls_cert_file(self) -> Path | None: ...
    @property
    def tls_key_file(self) -> Path | None: ...
    @property
    def layout(self) -> Layout: ...
    @property
    def urls(self) -> list[str]: ...
    @property
    def masked_url(self) -> str: ...


# ---- the checks (Settings' validators call these) ---------------------------------

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def to_ms(value: Any) -> Any:
    """Accept ``"10ms"``, ``0.01`` (seconds) or a timedelta; keep whole milliseconds."""
    if isinstance(value, (str, int, float)) or hasattr(value, "total_seconds"):
        try:
            us = parse_duration_us(value, what="duration")
        except DelayError as exc:
            raise ValueError(str(exc)) from None
        if us % 1000:
            raise ValueError(f"{value!r} is not a whole number of milliseconds")
        return us // 1000
    return value


def split_url_text(text: str) -> list[str]:
    """Each address of a comma-separated URL setting, in the order given."""
    return [u.strip() for u in text.split(",") if u.strip()]


def vhost_of(url: str) -> str:
    """The virtual host an AMQP URL names, as pika reads it (none or ``/``: ``/``)."""
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


def mask_url(url: str) -> str:
    """Hide the password of an AMQP URL, or of each URL of a comma-separated list.

    It never parses the URL strictly, so a URL that does not parse (a bad port, a raw
    ``/``, ``@`` or ``,`` in its password) is masked too, and never raises.
    """
    starts = [m.start() for m in _SCHEME.finditer(url)]
    if not starts or starts[0] != 0:
        starts.insert(0, 0)
    ends = [*starts[1:], len(url)]
    return "".join(_mask_one(url[a:b]) for a, b in zip(starts, ends, strict=True))


def _mask_one(url: str) -> str:
    """``scheme://user:***@rest``: the password runs from the first ``:`` of the user
    part to the last ``@`` of the URL, not of its authority: a raw ``/`` in a password
    ends the authority early (``u:p@x/secret@h``). A vhost with an ``@`` is masked too."""
    scheme = _SCHEME.match(url)
    head = scheme.group(0) if scheme else ""
    rest = url[len(head) :]
    at = rest.rfind("@")
    user, colon, _password = rest[: max(at, 0)].partition(":")
    if at < 0 or not colon:
        return url
    return f"{head}{user}:***@{rest[at + 1 :]}"


def _check_port(setting: str, url: str, parts: SplitResult) -> None:
    """A port that does not parse fails at connect with words of the client library."""
    try:
        port = parts.port
    except ValueError:  # not a number, or over 65535
        port = 0
    if port == 0:
        raise ValueError(
            f"{setting} {mask_url(url)!r} has a bad port: give a number from 1 to 65535"
        )


def check_amqp_urls(urls: list[str]) -> None:
    """Each an AMQP URL with a good port; one scheme and one virtual host for all."""
    schemes = set()
    vhosts: dict[str, str] = {}
    for part in urls or [""]:
        parts = urlsplit(part)
        if parts.scheme not in ("amqp", "amqps") or not parts.hostname:
            raise ValueError(
                f"url {mask_url(part)!r} is not an AMQP URL: give "
                "amqp://user:password@host:port/vhost (amqps:// for TLS)"
            )
        _check_port("url", part, parts)
        schemes.add(parts.scheme)
        vhosts.setdefault(vhost_of(part), mask_url(part))
    if len(schemes) > 1:  # TLS is set for all of them, from the first
        raise ValueError("url mixes amqp:// and amqps:// addresses: use one scheme for all")
    if len(vhosts) > 1:  # a cluster's nodes hold the same vhosts: one is meant
        named = "; ".join(f"{v!r} in {u!r}" for v, u in vhosts.items())
        raise ValueError(
            f"url names several virtual hosts ({named}): the URLs are one cluster's "
            "nodes, so give each the same vhost"
        )


def check_management_urls(urls: list[str]) -> None:
    for part in urls:
        parts = urlsplit(part)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"management_url must be http(s)://host:port, got {mask_url(part)!r}")
        _check_port("management_url", part, parts)


def check_radix(radix: int) -> int:
    if not 2 <= radix <= 16:
        raise ValueError(f"radix must be from 2 to 16, got {radix}: each digit is one of 0-9a-f")
    return radix


def check_resolution(resolution: int) -> int:
    if resolution <= 0:
        raise ValueError(f"resolution must be at least 1ms, got {resolution}ms")
    return resolution


def check_prefix(prefix: str) -> str:
    if prefix == "amq" or prefix.startswith("amq."):
        raise ValueError(
            f"prefix {prefix!r} must not start with 'amq.' or be 'amq' (RabbitMQ's own names)"
        )
    if not _NAME.match(prefix):
        raise ValueError(
            f"prefix {prefix!r} must be one name: words of letters, digits, '-' or '_' "
            "run together, with no dots (the topology's names and routing patterns "
            "use dots) and no spaces"
        )
    return prefix


def read_config(path: Path | None) -> dict[str, Any]:
    """The TOML file's table (empty without a file); a missing or malformed file is
    refused naming it."""
    if path is None:
        return {}
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


# ---- the light settings --------------------------------------------------------------

build_layout = lru_cache(maxsize=64)(Layout.build)
"""Layouts by value, shared by both kinds of settings."""


class _LayoutFields(Protocol):
    """The settings a layout is made of, as both settings classes hold them."""

    @property
    def prefix(self) -> str: ...
    @property
    def resolution(self) -> int: ...
    @property
    def radix(self) -> int: ...
    @property
    def positions(self) -> int | None: ...
    @property
    def max_delay(self) -> int | None: ...
    @property
    def named_tiers(self) -> Sequence[int]: ...
    @property
    def max_destination_length(self) -> int: ...
    @property
    def queue_type(self) -> Literal["quorum", "classic"]: ...
    @property
    def delivery_limit(self) -> int: ...
    @property
    def schedule_journal(self) -> bool: ...
    @property
    def journal_retention(self) -> int: ...
    @property
    def queue_leader_locator(self) -> Literal["balanced", "client-local", "none"]: ...
    @property
    def quorum_group_size(self) -> int | None: ...


def layout_of(s: _LayoutFields) -> Layout:
    """The layout the settings describe (one place for both settings classes)."""
    return build_layout(
        prefix=s.prefix,
        resolution_ms=s.resolution,
        radix=s.radix,
        positions=s.positions,
        max_delay_ms=s.max_delay,
        named_tiers_ms=tuple(s.named_tiers),
        max_destination_length=s.max_destination_length,
        queue_type=s.queue_type,
        delivery_limit=s.delivery_limit,
        journal=s.schedule_journal,
        journal_retention=s.journal_retention,
        leader_locator=None if s.queue_leader_locator == "none" else s.queue_leader_locator,
        quorum_group_size=s.quorum_group_size,
    )


@dataclass(frozen=True)
class LightSettings:
    """The settings' values, as :class:`~rmqdelay.settings.Settings` would hold them,
    read by :func:`load_light_settings`. The URLs are plain text: never shown (not in
    the ``repr``), masked by :attr:`masked_url`."""

    url: str = field(default="amqp://guest:guest@localhost:5672/%2F", repr=False)
    url_order: Literal["ordered", "shuffled"] = "ordered"
    management_url: str | None = field(default=None, repr=False)
    prefix: str = "rmqdelay"
    resolution: int = 10
    radix: int = 16
    positions: int | None = None
    max_delay: int | None = None
    named_tiers: tuple[int, ...] = ()
    queue_type: Literal["quorum", "classic"] = "quorum"
    delivery_limit: int = 20
    queue_leader_locator: Literal["balanced", "client-local", "none"] = "balanced"
    quorum_group_size: int | None = None
    schedule_journal: bool = True
    journal_bodies: bool = True
    journal_retention: int = DEFAULT_JOURNAL_RETENTION
    destinations: tuple[str, ...] = ()
    max_destination_length: int = 100
    confirm_timeout: float = 30.0
    connection_name: str = "rmqdelay"
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None

    @property
    def layout(self) -> Layout:
        return layout_of(self)

    @property
    def urls(self) -> list[str]:
        return split_url_text(self.url)

    @property
    def management_urls(self) -> list[str]:
        return split_url_text(self.management_url or "")

    @property
    def vhost(self) -> str:
        return vhost_of(self.urls[0])

    @property
    def masked_url(self) -> str:
        return mask_url(self.url)


class _NotPlain(Exception):
    """A value the light loader does not take: the model reads it."""


_ENV_PREFIX = "rmqdelay_"
_FIELDS = {f.name for f in fields(LightSettings)}
_INT = re.compile(r"0|[1-9][0-9]{0,8}")
_FLOAT = re.compile(r"(0|[1-9][0-9]{0,8})(\.[0-9]{1,9})?")
_BOOLS = {"true": True, "false": False, "1": True, "0": False}
_CHOICES: dict[str, tuple[str, ...]] = {
    "url_order": ("ordered", "shuffled"),
    "queue_type": ("quorum", "classic"),
    "queue_leader_locator": ("balanced", "client-local", "none"),
}
_POSITIVE = ("delivery_limit", "quorum_group_size", "max_destination_length")


def _text(value: Any) -> str:
    if type(value) is not str or value.lstrip().startswith("["):
        raise _NotPlain
    return value


def _int(value: Any) -> int:
    if type(value) is int:
        return value
    if type(value) is str and _INT.fullmatch(value):
        return int(value)
    raise _NotPlain


def _read(name: str, value: Any) -> Any:
    """*value* of setting *name* as the model holds it; :class:`_NotPlain` for anything
    the model might read otherwise, or would refuse (a check's ``ValueError``)."""
    if name == "url":
        text = _text(value)
        check_amqp_urls(split_url_text(text))
        return text
    if name == "management_url":
        urls = split_url_text(_text(value))
        check_management_urls(urls)
        return _text(value) if urls else None
    if name == "prefix":
        return check_prefix(_text(value))
    if name == "connection_name":
        return _text(value)
    if name in _CHOICES:
        if _text(value) not in _CHOICES[name]:
            raise _NotPlain
        return value
    if name == "radix":
        return check_radix(_int(value))
    if name in ("resolution", "max_delay"):
        if type(value) not in (str, int, float):
            raise _NotPlain
        ms = to_ms(value)
        return check_resolution(ms) if name == "resolution" else ms
    if name in _POSITIVE or name == "positions":
        number = _int(value)
        if name in _POSITIVE and number < 1:
            raise _NotPlain
        return number
    if name in ("schedule_journal", "journal_bodies"):
        if type(value) is bool:
            return value
        if type(value) is str and value in _BOOLS:
            return _BOOLS[value]
        raise _NotPlain
    if name == "journal_retention":
        if type(value) not in (str, int):
            raise _NotPlain
        try:
            return parse_size(value)
        except ConfigurationError:
            raise _NotPlain from None  # the model says what is wrong
    if name == "confirm_timeout":
        if type(value) in (int, float) and value > 0:
            return float(value)
        if type(value) is str and _FLOAT.fullmatch(value) and float(value) > 0:
            return float(value)
        raise _NotPlain
    if name in ("tls_ca_file", "tls_cert_file", "tls_key_file"):
        path = value if isinstance(value, Path) else Path(_text(value))
        if not path.is_file():
            raise _NotPlain
        return path
    raise _NotPlain  # named_tiers, destinations (lists), or a name the model refuses


def _environment() -> dict[str, str]:
    """``RMQDELAY_*`` variables of a setting, by setting; names in any case, as
    pydantic-settings reads them (two spellings of one: :class:`_NotPlain`)."""
    found: dict[str, str] = {}
    for key, value in os.environ.items():
        lower = key.lower()
        if lower.startswith(_ENV_PREFIX) and lower[len(_ENV_PREFIX) :] in _FIELDS:
            name = lower[len(_ENV_PREFIX) :]
            if name in found:
                raise _NotPlain
            found[name] = value
    return found


def load_light_settings(
    config: Path | str | None = None, **overrides: Any
) -> LightSettings | Settings:
    """What :func:`~rmqdelay.settings.load_settings` gives for the same arguments and
    environment, read without pydantic when every value given is plain and valid (a
    :class:`LightSettings`); otherwise :func:`~rmqdelay.settings.load_settings`'s own
    result or error."""
    path = Path(config) if config is not None else None
    table = read_config(path)  # its errors are the model loader's: it reads the same way
    try:
        given = {**table, **_environment(), **{k: v for k, v in overrides.items() if v is not None}}
        if not all(isinstance(k, str) and k in _FIELDS for k in given):
            raise _NotPlain
        values = {name: _read(name, value) for name, value in given.items()}
        light = LightSettings(**values)
        _ = light.layout  # the checks that need more than one field
    except (_NotPlain, ValueError):
        from .settings import load_settings

        return load_settings(path, **overrides)
    return light
