"""Handlers: read a function's signature once, then decode each body the way it asks.

Pure. The type of a handler's first parameter says how the body is decoded:

- ``bytes``: the raw body;
- ``str``: the body as UTF-8 text;
- a pydantic model: ``Model.model_validate_json(body)``;
- ``dict``, ``list``, ``int``, ``dict[str, int]``, a TypedDict, a dataclass...: JSON
  validated by a pydantic ``TypeAdapter``;
- no annotation, ``Any`` or ``object``: by content type: JSON, text, else bytes.

A second parameter, if any, receives the :class:`~rmqdelay.Context`.
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_origin, get_type_hints

from pydantic import BaseModel, TypeAdapter, ValidationError

from ...errors import ConfigurationError
from .retry import DecodeError, RetryPolicy

__all__ = ["Decoder", "HandlerSpec", "inspect_handler", "make_decoder"]

Decoder = Callable[[bytes, "str | None"], Any]
"""Turn a body and its content type into the handler's argument; raise DecodeError."""

_MAX_DETAIL = 600


def _is_json(content_type: str | None) -> bool:
    base = (content_type or "").split(";")[0].strip().lower()
    return base == "application/json" or base.endswith("+json")


def _decode_text(body: bytes, content_type: str | None) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"body is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _decode_bytes(body: bytes, content_type: str | None) -> bytes:
    return body


def _decode_auto(body: bytes, content_type: str | None) -> Any:
    if _is_json(content_type):
        try:
            return json.loads(body)
        except ValueError as exc:
            raise DecodeError(f"body is not valid JSON: {exc}") from None
    base = (content_type or "").split(";")[0].strip().lower()
    if base.startswith("text/"):
        return _decode_text(body, content_type)
    return body


def _validation_detail(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False)[:5]:
        where = ".".join(str(p) for p in error.get("loc", ())) or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    more = exc.error_count() - len(parts)
    text = "; ".join(parts) + (f"; and {more} more" if more > 0 else "")
    return text[:_MAX_DETAIL]


def _type_name(tp: Any) -> str:
    if get_origin(tp) is None and isinstance(getattr(tp, "__name__", None), str):
        return str(tp.__name__)
    return repr(tp).replace("typing.", "")


def make_decoder(annotation: Any) -> Decoder:
    """Build the decoder for a first-parameter annotation (``inspect.Parameter.empty`` for none)."""
    if annotation in (inspect.Parameter.empty, Any, object):
        return _decode_auto
    if annotation is bytes:
        return _decode_bytes
    if annotation is str:
        return _decode_text
    name = _type_name(annotation)
    validate: Callable[[bytes], Any]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        validate = annotation.model_validate_json
    else:
        try:
            validate = TypeAdapter(annotation).validate_json
        except Exception as exc:  # pydantic raises several kinds for unsupported types
            raise ConfigurationError(
                f"cannot decode message bodies as {name}: {exc}. Annotate the message "
                "parameter with bytes, str, dict, a pydantic model or another JSON type"
            ) from None

    def decode_json(body: bytes, content_type: str | None) -> Any:
        try:
            return validate(body)
        except ValidationError as exc:
            raise DecodeError(
                f"body does not validate as {name}: {_validation_detail(exc)}"
            ) from None

    return decode_json


@dataclass(frozen=True)
class HandlerSpec:
    """A registered handler: how to decode, how to call, and its retry policy."""

    destination: str
    func: Callable[..., Any]
    is_async: bool
    wants_context: bool
    decoder: Decoder
    body_type: str
    policy: RetryPolicy

    @property
    def name(self) -> str:
        return getattr(self.func, "__qualname__", None) or repr(self.func)


def _unwrap(func: Callable[..., Any]) -> Callable[..., Any]:
    while isinstance(func, functools.partial):
        func = func.func
    return func


def _hints_of(func: Callable[..., Any]) -> dict[str, Any]:
    """Resolved annotations of a function, method, partial or object with ``__call__``."""
    target = _unwrap(func)
    if not (inspect.isfunction(target) or inspect.ismethod(target)):
        target = type(target).__call__
    return get_type_hints(target)


def _is_async(func: Callable[..., Any]) -> bool:
    target = _unwrap(func)
    if inspect.iscoroutinefunction(target):
        return True
    call = getattr(target, "__call__", None)  # noqa: B004 - objects with async __call__
    return not inspect.isfunction(target) and inspect.iscoroutinefunction(call)


def inspect_handler(
    destination: str, func: Callable[..., Any], policy: RetryPolicy, *, context: type
) -> HandlerSpec:
    """Check a handler's signature and build its spec; raise ConfigurationError if unusable.

    ``context``: the type of the second parameter (:class:`~rmqdelay.Context`, which
    lives in the worker), so that a message parameter annotated with it is refused.
    """
    if not callable(func):
        raise ConfigurationError(f"handler for {destination!r} must be callable, got {func!r}")
    name = getattr(func, "__qualname__", None) or repr(func)
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise ConfigurationError(f"handler {name} for {destination!r} must not be a generator")
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot read the signature of handler {name}: {exc}") from None
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    variadic = any(p.kind is p.VAR_POSITIONAL for p in signature.parameters.values())
    required = [p for p in signature.parameters.values() if p.default is p.empty]
    required_kw = [p for p in required if p.kind is p.KEYWORD_ONLY]
    if not positional and not variadic:
        raise ConfigurationError(
            f"handler {name} for {destination!r} takes no message parameter: "
            "define it as `def handler(msg: Model, ctx: rmqdelay.Context)`"
        )
    required_pos = [p for p in positional if p.default is p.empty]
    if len(required_pos) > 2 or required_kw:
        extra = [p.name for p in (*required_pos[2:], *required_kw)]
        raise ConfigurationError(
            f"handler {name} for {destination!r} has required parameters {extra} that the "
            "worker cannot fill: it passes (msg) or (msg, ctx); give them defaults"
        )
    wants_context = variadic or len(positional) >= 2
    annotation: Any = inspect.Parameter.empty
    if positional:
        first = positional[0]
        annotation = first.annotation
        if isinstance(annotation, str) or annotation is not inspect.Parameter.empty:
            try:
                hints = _hints_of(func)
            except Exception as exc:  # NameError for unresolvable forward references
                raise ConfigurationError(
                    f"cannot resolve the type hints of handler {name}: {exc}; import the "
                    "types it names at module level"
                ) from None
            annotation = hints.get(first.name, annotation)
    if annotation is context:
        raise ConfigurationError(
            f"handler {name} for {destination!r}: the first parameter is the message, "
            "the second the Context"
        )
    return HandlerSpec(
        destination=destination,
        func=func,
        is_async=_is_async(func),
        wants_context=wants_context,
        decoder=make_decoder(annotation),
        body_type="auto" if annotation is inspect.Parameter.empty else _type_name(annotation),
        policy=policy,
    )
