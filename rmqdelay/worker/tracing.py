"""The handler's span: ``process {destination}`` (kind ``CONSUMER``), linked to the
span that created the message (:mod:`rmqdelay.core.tracing`) rather than its child, as
OpenTelemetry's messaging conventions advise when a message waits: the publish's trace
ends when it returns, and the handling may run an hour later.

The span is current while the handler runs, so the handler's own spans are its
children. It carries the messaging attributes, the attempt, the due time, the lateness
and the delay (when the publish said when it was sent), and the outcome; a handler
that raised is recorded as the span's exception and error status.
"""

from __future__ import annotations

from typing import Any

from ..core.tracing import SENT_AT, TRACER, attributes
from .delivery import Delivery
from .hooks import Settled, WorkerHook

__all__ = ["TracingHook"]


class TracingHook(WorkerHook):
    """Opens the span before the handler and closes it once the message is settled."""

    def __init__(self) -> None:
        self._open: dict[int, tuple[Any, object]] = {}

    def before_handle(self, delivery: Delivery) -> bool:
        from opentelemetry import context, propagate, trace

        created = trace.get_current_span(propagate.extract(delivery.headers)).get_span_context()
        fields = attributes(delivery.destination, delivery.message_id, "process")
        fields["rmqdelay.attempt"] = delivery.attempt
        if delivery.due_ms is not None:
            fields["rmqdelay.due_at_ms"] = delivery.due_ms
            fields["rmqdelay.lateness_ms"] = delivery.lateness_ms or 0
            sent = delivery.headers.get(SENT_AT)
            if isinstance(sent, int) and not isinstance(sent, bool):
                fields["rmqdelay.delay_ms"] = max(0, delivery.due_ms - sent)  # ± 1 ms
        span = trace.get_tracer(TRACER).start_span(
            f"process {delivery.destination}",
            kind=trace.SpanKind.CONSUMER,
            links=[trace.Link(created)] if created.is_valid else [],
            attributes=fields,
        )
        token = context.attach(trace.set_span_in_context(span))
        self._open[id(delivery)] = (span, token)
        return False

    def after_settle(self, delivery: Delivery, settled: Settled) -> None:
        opened = self._open.pop(id(delivery), None)
        if opened is None:
            return
        from opentelemetry import context, trace

        span, token = opened
        span.set_attribute("rmqdelay.outcome", settled.outcome)
        if settled.error is not None:
            span.record_exception(settled.error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, type(settled.error).__name__))
        span.end()
        context.detach(token)  # type: ignore[arg-type]
