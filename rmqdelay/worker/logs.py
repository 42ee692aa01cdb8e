"""Structured logs for workers: one line per event, with the message's fields.

Each record may carry ``extra`` fields (message id, destination, attempt, lateness);
the formatter appends them as ``key=value`` or emits a JSON object. Whatever the
text, the formatter masks the passwords of the URLs it is given (every AMQP and
management address), so a connection error that quotes a URL does not leak it.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from ..settings import SecretUrl, mask_url, reveal, split_urls
from .delivery import Delivery
from .hooks import Settled, WorkerHook

__all__ = ["FIELDS", "LEVELS", "LogHook", "StructuredFormatter", "configure_logging"]

log = logging.getLogger("rmqdelay.worker")

FIELDS = (
    "message_id",
    "destination",
    "attempt",
    "lateness_ms",
    "outcome",
    "delay_ms",
    "duration_ms",
    "reason",
    "error",
    "queue",
    "url",
)
"""The ``extra`` keys the formatter shows, in this order."""

LEVELS = {
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "CRITICAL": logging.CRITICAL,
}
LogFormat = Literal["text", "json"]
_AT_INFO = frozenset(("acked", "requeued", "cancelled", "dropped", "forwarded"))
"""The outcomes logged at INFO."""
_SAFE = re.compile(r"^[\w.:/@+-]+$")


class LogHook(WorkerHook):
    """One line per message when it is settled: what happened, with its fields."""

    def before_handle(self, delivery: Delivery) -> bool:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("received", extra=delivery.fields)
        return False

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        outcome = settled.outcome
        if outcome in _AT_INFO and not log.isEnabledFor(logging.INFO):
            return  # no line: not even its fields
        fields = delivery.fields
        fields["outcome"] = outcome
        if settled.seconds is not None:
            fields["duration_ms"] = round(settled.seconds * 1000, 1)
        if outcome == "acked":
            log.info("handled", extra=fields)
        elif outcome in ("requeued", "cancelled"):
            log.info(outcome, extra=fields)
        elif outcome == "dropped":
            fields["reason"] = settled.reason
            log.info("dropped: %s", settled.reason, extra=fields)
        elif outcome == "forwarded":
            fields.update(delay_ms=settled.delay_ms, reason=settled.reason)
            log.info("forwarded: %s", settled.reason, extra=fields)
        elif outcome == "retried":
            fields.update(delay_ms=settled.delay_ms, reason=settled.reason)
            log.warning("retrying", extra=fields)
        elif outcome == "parked":
            fields.update(reason=settled.reason, traceback=settled.traceback)
            log.error("parked", extra=fields)
        else:
            log.warning("%s: the broker delivers it again", settled.problem, extra=fields)


class StructuredFormatter(logging.Formatter):
    """``time level logger message key=value...`` or one JSON object per line."""

    def __init__(self, fmt: LogFormat = "text", *urls: SecretUrl | str | None) -> None:
        super().__init__()
        self.fmt = fmt
        self._secrets: list[tuple[str, str]] = []
        for url in urls:
            if url:  # the whole list first: a raw ',' in a password splits it wrongly
                self._secrets.append((reveal(url), mask_url(reveal(url))))
            for address in split_urls(url):  # each node's password, should a library log it
                self._secrets.append((address, mask_url(address)))
                password = urlsplit(address).password
                for raw in {password, unquote(password or "")} - {None, ""}:
                    self._secrets.append((f":{raw}@", ":***@"))

    def _redact(self, text: str) -> str:
        for secret, masked in self._secrets:
            text = text.replace(secret, masked)
        return text

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: getattr(record, k) for k in FIELDS if getattr(record, k, None) is not None}
        message = record.getMessage()
        error = None
        if record.exc_info:
            error = self.formatException(record.exc_info)
        trace = getattr(record, "traceback", None)
        if error is None and isinstance(trace, str) and trace:
            error = trace.rstrip("\n")  # a handler's traceback, formatted where it ran
        when = datetime.fromtimestamp(record.created, tz=timezone.utc)
        if self.fmt == "json":
            doc: dict[str, Any] = {
                "time": when.isoformat(timespec="milliseconds"),
                "level": record.levelname.lower(),
                "logger": record.name,
                "message": message,
                **fields,
            }
            if error:
                doc["traceback"] = error
            return self._redact(json.dumps(doc, default=str))
        parts = [
            when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z",
            f"{record.levelname:<7}",
            record.name,
            message,
        ]
        for key, value in fields.items():
            text = str(value)
            parts.append(f"{key}={text}" if _SAFE.match(text) else f"{key}={json.dumps(text)}")
        line = " ".join(parts)
        if error:
            line += "\n" + error
        return self._redact(line)


def configure_logging(
    level: str | int = "INFO", fmt: LogFormat = "text", *urls: SecretUrl | str | None
) -> None:
    """Send every log record to stderr through the structured formatter, which masks
    the passwords of ``urls`` (the settings' ``url`` and ``management_url``)."""
    if isinstance(level, str):
        name = level.upper()
        if name not in LEVELS:
            raise ValueError(f"unknown log level {level!r}: use {', '.join(LEVELS)}")
        level = LEVELS[name]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(StructuredFormatter(fmt, *urls))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # aiormq and aio-pika are chatty at INFO; keep them to warnings unless debugging.
    for name in ("aiormq", "aio_pika"):
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    # aiormq logs a failed connect at ERROR, and the worker says it again with the masked
    # URL and its retry plan (a WARNING, as it retries): keep one line per attempt.
    logging.getLogger("aiormq.connection").setLevel(
        logging.DEBUG if level <= logging.DEBUG else logging.CRITICAL
    )
