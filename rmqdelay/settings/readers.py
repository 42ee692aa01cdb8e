"""How a setting's value is read, from a flag, the environment, a TOML file or Python:
each reader takes the value as given and returns it as :class:`~rmqdelay.settings.Settings`
holds it, or raises a ``ValueError`` saying what is wrong (never showing a secret).

The wording of a wrong type or range is pydantic's, which these settings were read with
before, so that a message a user has met reads the same. The secrets (:class:`SecretUrl`,
:class:`SecretStr`) and the URL helpers the broker code uses live here too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from ..core.durations import format_ms, parse_duration_us
from ..errors import DelayError


class SecretStr:
    """A text only an explicit :meth:`get_secret_value` shows; ``str()``, ``repr()``,
    :meth:`Settings.as_dict` and :meth:`Settings.to_json` show it masked."""

    __slots__ = ("_secret",)

    def __init__(self, secret: str) -> None:
        self._secret = secret

    def get_secret_value(self) -> str:
        return self._secret

    def _display(self) -> str:
        return "**********" if self._secret else ""

    def __str__(self) -> str:
        return self._display()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._display()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretStr) and other._secret == self._secret

    def __hash__(self) -> int:
        return hash(self._secret)


class SecretUrl(SecretStr):
    """One URL, or several joined by commas, shown with each password masked
    (``amqp://u:***@host/%2F``); ``get_secret_value()`` gives the raw text, for
    connecting only."""

    __slots__ = ()

    def _display(self) -> str:
        return mask_url(self._secret)


def reveal(url: SecretStr | str) -> str:
    """The raw text of a URL setting (a plain ``str`` is let through)."""
    return url.get_secret_value() if isinstance(url, SecretStr) else url


def split_urls(url: SecretStr | str | None) -> list[str]:
    """Each address of a URL setting, raw, in the order given."""
    return [u.strip() for u in reveal(url or "").split(",") if u.strip()]


def vhost_of(url: str) -> str:
    """The virtual host an AMQP URL names, as pika reads it (none or ``/``: ``/``)."""
    path = urlsplit(url).path
    return unquote(path[1:]) if len(path) > 1 else "/"


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


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


Reader = Callable[[Any], Any]
"""Reads one setting's value as given; a ``ValueError`` says what is wrong with it."""


class ItemError(ValueError):
    """An item of a list is wrong: its index goes into the error's location."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


def text(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    if not isinstance(value, str):
        raise ValueError("Input should be a valid string")
    return value


_WHOLE = re.compile(r"\s*[+-]?[0-9][0-9_]*(\.0*)?\s*")


def integer(value: Any) -> int:
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, float):
        raise ValueError("Input should be a valid integer, got a number with a fractional part")
    if isinstance(value, str):
        try:
            if _WHOLE.fullmatch(value):
                return int(value.strip().split(".")[0])
        except ValueError:
            pass
        raise ValueError("Input should be a valid integer, unable to parse string as an integer")
    raise ValueError("Input should be a valid integer")


def number(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise ValueError(
                "Input should be a valid number, unable to parse string as a number"
            ) from None
    raise ValueError("Input should be a valid number")


_TRUE, _FALSE = {"1", "on", "t", "true", "y", "yes"}, {"0", "off", "f", "false", "n", "no"}


def boolean(value: Any) -> bool:
    if isinstance(value, (bool, int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    unreadable = "" if not isinstance(value, (str, int)) else ", unable to interpret input"
    raise ValueError(f"Input should be a valid boolean{unreadable}")


def path_of(value: Any) -> Path:
    if isinstance(value, (str, Path)):
        return Path(value)
    raise ValueError("Input is not a valid path for <class 'pathlib.Path'>")


def duration_ms(value: Any) -> int:
    """Whole milliseconds, given as ``"10ms"``, seconds, or a timedelta."""
    if isinstance(value, (str, int, float)) or hasattr(value, "total_seconds"):
        try:
            us = parse_duration_us(value, what="duration")
        except DelayError as exc:
            raise ValueError(str(exc)) from None
        if us % 1000:
            raise ValueError(f"{value!r} is not a whole number of milliseconds")
        return us // 1000
    return integer(value)


def choice(*options: str) -> Reader:
    said = " or ".join(", ".join(repr(o) for o in options).rsplit(", ", 1))

    def read(value: Any) -> str:
        if value not in options:
            raise ValueError(f"Input should be {said}")
        return str(value)

    return read


def at_least(read: Reader, low: float, *, high: int | None = None, strict: bool = False) -> Reader:
    def bounded(value: Any) -> Any:
        number = read(value)
        if strict and not number > low:
            raise ValueError(f"Input should be greater than {low:g}")
        if not strict and not number >= low:
            raise ValueError(f"Input should be greater than or equal to {low:g}")
        if high is not None and number > high:
            raise ValueError(f"Input should be less than or equal to {high}")
        return number

    return bounded


def optional(read: Reader) -> Reader:
    return lambda value: None if value is None else read(value)


def list_of(read: Reader) -> Reader:
    def items(value: Any) -> list[Any]:
        if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
            raise ValueError("Input should be a valid list")
        found = []
        for index, item in enumerate(value):
            try:
                found.append(read(item))
            except ValueError as exc:
                raise ItemError(index, str(exc)) from None
        return found

    return items


def urls(setting: str, kind: str, check: Callable[[list[str]], None]) -> Reader:
    def read(value: Any) -> SecretUrl | None:
        """Several addresses: a list (TOML, or JSON in the environment) or commas."""
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ValueError(
                    f"{setting} looks like a JSON list but is not valid JSON"
                ) from None
        if isinstance(value, (list, tuple)):
            if not value or not all(isinstance(v, (str, SecretUrl)) for v in value):
                raise ValueError(f"{setting} must be one {kind} URL or a non-empty list of them")
            value = ",".join(reveal(v).strip() for v in value)
        url = value if isinstance(value, SecretUrl) else SecretUrl(text(value))
        check(split_urls(url))
        # a management_url of no address: none given, each AMQP host's API is meant
        return url if split_urls(url) or setting == "url" else None

    return read


def secret(value: Any) -> SecretStr:
    return value if isinstance(value, SecretStr) else SecretStr(text(value))


def prefix_name(value: Any) -> str:
    prefix = text(value)
    if prefix == "amq" or prefix.startswith("amq."):
        raise ValueError(
            f"prefix {prefix!r} must not start with 'amq.' or be 'amq' (RabbitMQ's own names)"
        )
    if not re.fullmatch(r"[A-Za-z0-9_-]+", prefix):
        raise ValueError(
            f"prefix {prefix!r} must be one name: words of letters, digits, '-' or '_' "
            "run together, with no dots (the topology's names and routing patterns "
            "use dots) and no spaces"
        )
    return prefix


def radix(value: Any) -> int:
    radix = integer(value)
    if not 2 <= radix <= 16:
        raise ValueError(f"radix must be from 2 to 16, got {radix}: each digit is one of 0-9a-f")
    return radix


def resolution(value: Any) -> int:
    resolution = duration_ms(value)
    if resolution <= 0:
        raise ValueError(f"resolution must be at least 1ms, got {resolution}ms")
    return resolution


def tiers(value: Any) -> list[int]:
    tiers: list[int] = list_of(duration_ms)(value)
    if len(set(tiers)) != len(tiers):
        raise ValueError(f"named_tiers repeat a duration: {[format_ms(t) for t in tiers]}")
    if len(tiers) > 8:
        raise ValueError("at most 8 named tiers are supported")
    return sorted(tiers, reverse=True)


def tls_file(name: str) -> Reader:
    def read(value: Any) -> Path:
        # checked here, or ssl says only "[Errno 2] No such file or directory", no name
        path = path_of(value)
        if not path.is_file():
            raise ValueError(f"{name} {str(path)!r} is not a file")
        return path

    return optional(read)
