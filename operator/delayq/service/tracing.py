"""OpenTelemetry traces of the delay service, following the messaging semantic conventions;
off unless the standard `OTEL_*` variables ask for an OTLP export.

A `schedule <topic>` span (kind PRODUCER) is the child of the producer's context, the
message's `traceparent`; the message keeps that context, unchanged, to its delivery. Each
delivery attempt is a trace of its own *linked* to it, not a child: the wait can be a year, and
a year-long parent span breaks every trace view. On a push topic (webhook, stream) it starts
with the `claim <topic>` span (kind CLIENT, `receive`) of the message as the claim returned it;
its child `deliver <topic>` (kind CONSUMER, `process`, linked to the producer too) runs while
the sink hands the message over. A webhook POST carries the delivery span's context as its
`traceparent` HTTP header (the receiver's server span is the child of the POST that reached
it), and the producer's in the body's `headers.traceparent` for the receiver to link to, as
delayq does. The engine answers the attempt's ack or nack after it, in batches: an `ack
<topic>`, `nack <topic>` (retried) or `dead <topic>` (given up) span (kind CLIENT, `settle`),
the child of that attempt's deliver span. A pull topic's lease is a `claim <topic>` span per
message leased, linked likewise (what the consumer does then is its own to trace); the
consumer's ack, nack and extend over HTTP are `ack`, `nack`/`dead` and `extend <topic>` spans,
the children of that lease's claim span when this process leased it (remembered by lease, as
the push attempts are: a token carries no span context), else each in a trace of its own.

When off, `from_env` returns None, nothing of OpenTelemetry is imported, and each hook on the
hot paths is one `is None` test. The export is OTLP over HTTP/protobuf
(`opentelemetry-exporter-otlp-proto-http`, the `[tracing]` extra), configured by the
exporter's own variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, `..._TRACES_ENDPOINT`,
`..._HEADERS`, ...), the batch processor's (`OTEL_BSP_*`), the sampler's
(`OTEL_TRACES_SAMPLER`) and the resource's (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, TypeVar

from delayq.extras import missing_extra
from delayq.queue.codes import Code
from delayq.queue.model import Lease, Message, Outcome, Retry, ScheduleRequest
from delayq.queue.trace_context import TRACEPARENT, TRACESTATE

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanContext, Tracer

K = TypeVar("K")
V = TypeVar("V")
EXPORTERS = ("otlp", "none")
TRACING_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
SYSTEM = "delayq"
# attempts whose ack or nack answer is awaited, and push claims whose delivery has not started,
# at most this many each (an answer that never comes, its broker down, or a claimed message
# given back undelivered, leaves its entry until newer ones push it out)
MAX_AWAITED = 10_000
# the engine's answers to a nack that end in a span: retried later, or given up
NACK_SPANS = {Code.RETRY_SCHEDULED: "nack", Code.DEAD: "dead", Code.DROPPED: "dead"}


class TracingConfigError(ValueError):
    """The OTEL_* variables ask for what delayq cannot export (a one-line start-up error)."""


def wanted(env: Mapping[str, str]) -> bool:
    """Tracing is on when the variables name an OTLP export: `OTEL_TRACES_EXPORTER=otlp` or an
    OTLP endpoint, and `OTEL_SDK_DISABLED` is not `true`."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        if exporter not in EXPORTERS:
            raise TracingConfigError(
                f"OTEL_TRACES_EXPORTER={exporter!r}: delayq exports traces by OTLP only "
                f"(one of {', '.join(EXPORTERS)})"
            )
        return exporter == "otlp"
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


class Tracing:
    """The process's tracer and the spans of a message's life in it."""

    def __init__(self, tracer: Tracer, flush: Callable[[], object]) -> None:
        self.tracer = tracer
        self._flush = flush
        # message id -> (its attempt's deliver span, slot, attempt), until acked or nacked
        self._awaited: dict[str, tuple[SpanContext, int, int]] = {}
        # (message id, lease number) -> its push claim's span, until its delivery starts
        self._claims: dict[tuple[str, int], SpanContext] = {}
        # a pull lease -> (its claim span, the attempt), until acked or nacked
        self._leases: dict[Lease, tuple[SpanContext, int]] = {}

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Tracing | None:
        """The process's tracing, None when the variables do not ask for it (the default)."""
        if not wanted(env):
            return None
        protocol = env.get(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
        )
        if protocol not in ("", "http/protobuf"):
            raise TracingConfigError(
                f"OTLP protocol {protocol!r}: delayq exports OTLP over http/protobuf only"
            )
        if why := missing_extra("tracing", TRACING_MODULES):
            raise TracingConfigError(why)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        resource = Resource.create({} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: SYSTEM})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        return cls(provider.get_tracer("delayq"), provider.force_flush)

    def flush(self) -> None:
        """Export the spans ended so far (at a service's stop: none lost to the exit)."""
        self._flush()

    @contextmanager
    def schedule(self, topic: str, messages: Sequence[ScheduleRequest]) -> Iterator[Span]:
        """The span of one schedule request: a child of the one message's producer context,
        or, for a batch, a new span linking each message's (the conventions' batch send)."""
        from opentelemetry.trace import Link, SpanKind

        contexts = [_context_of(m.headers) for m in messages]
        parent = contexts[0] if len(messages) == 1 else None
        links = [] if parent is not None else [Link(c) for c in contexts if c is not None]
        with self.tracer.start_as_current_span(
            f"schedule {topic}",
            context=_as_parent(parent),
            kind=SpanKind.PRODUCER,
            links=links,
            attributes=_attributes(topic, "schedule", "send"),
        ) as span:
            if len(messages) == 1:
                span.set_attribute("messaging.message.id", messages[0].id)
            else:
                span.set_attribute("messaging.batch.message_count", len(messages))
            yield span

    @staticmethod
    def scheduled(span: Span, slots: Sequence[int]) -> None:
        """Name the slot of a one-message schedule span, known once it is stored."""
        if len(slots) == 1:
            span.set_attribute("messaging.delayq.slot", slots[0])

    def claimed(
        self, topic: str, messages: Sequence[Message], lateness_ms: Sequence[float]
    ) -> None:
        """A push topic's `claim <topic>` span per message a claim returned, each the root of
        the attempt's trace (linked to the producer's context), its delivery's parent."""
        for message, late_ms in zip(messages, lateness_ms, strict=True):
            span = self._claim_span(topic, message, late_ms)
            span.end()
            _remember(self._claims, (message.id, message.lease_id), span.get_span_context())

    @contextmanager
    def deliver(self, topic: str, message: Message, lateness_ms: float) -> Iterator[Span]:
        """The span of one delivery attempt, current while it runs (a webhook POST sends its
        context on): the child of the message's push claim span, else in a trace of its own,
        linked to the producer's context either way. Its `messaging.delayq.outcome` says how
        the attempt ended: `ack`, or `nack` (the retry or dead-letter decision is the
        engine's, the span of its answer the child of this one)."""
        from opentelemetry.trace import SpanKind, Status, StatusCode

        claim = self._claims.pop((message.id, message.lease_id), None)
        with self.tracer.start_as_current_span(
            f"deliver {topic}",
            context=_as_parent(claim),
            kind=SpanKind.CONSUMER,
            links=_links(message),
            attributes=_claimed(topic, "deliver", "process", message, lateness_ms),
            record_exception=True,
            set_status_on_exception=True,
        ) as span:
            attempt = (span.get_span_context(), message.slot, message.attempt)
            try:
                yield span
            except BaseException:
                span.set_attribute("messaging.delayq.outcome", "nack")
                _remember(self._awaited, message.id, attempt)
                raise
            span.set_attribute("messaging.delayq.outcome", "ack")
            span.set_status(Status(StatusCode.OK))
            _remember(self._awaited, message.id, attempt)

    def leased(self, topic: str, message: Message, lateness_ms: float) -> None:
        """A pull topic's `claim <topic>` span (kind CLIENT, `receive`) of one message leased
        to a consumer, in a trace of its own linked to the producer's context: what the
        consumer then does is its own to trace (the lease answer's `headers` carry the
        producer's context for it to link to). The lease's ack, nack and extend spans are
        its children."""
        span = self._claim_span(topic, message, lateness_ms)
        span.end()
        _remember(self._leases, message.lease, (span.get_span_context(), message.attempt))

    def lease_acked(self, topic: str, leases: Sequence[Lease], outcomes: list[Outcome]) -> None:
        """An `ack <topic>` span per pull lease a consumer acked (`POST /leases/ack`, or the
        `ack` of a lease request), as `acked` names it for a push attempt."""
        for lease, outcome in zip(leases, outcomes, strict=True):
            claim = self._leases.pop(lease, None)
            self._lease_span(topic, "ack", "settle", lease, outcome, claim).end()

    def lease_nacked(self, topic: str, retries: Sequence[Retry], outcomes: list[Outcome]) -> None:
        """A `nack <topic>` (retry scheduled) or `dead <topic>` (given up) span per pull lease
        a consumer nacked, as `nacked` names them; a refused nack (the lease was gone) is a
        `nack` span with an error status."""
        for retry, outcome in zip(retries, outcomes, strict=True):
            operation = NACK_SPANS.get(outcome.code, "nack")
            claim = self._leases.pop(retry.lease, None)
            self._lease_span(topic, operation, "settle", retry.lease, outcome, claim).end()

    def lease_extended(
        self, topic: str, leases: Sequence[Lease], outcomes: list[Outcome], ack_timeout_ms: int
    ) -> None:
        """An `extend <topic>` span per pull lease a consumer extended (the lease goes on: its
        later ack is the claim's child still). No operation type of the conventions fits
        keeping a message (it neither receives nor settles it), so it names none."""
        for lease, outcome in zip(leases, outcomes, strict=True):
            span = self._lease_span(topic, "extend", None, lease, outcome, self._leases.get(lease))
            span.set_attribute("messaging.delayq.ack_timeout_ms", ack_timeout_ms)
            span.end()

    def acked(self, topic: str, outcomes: list[Outcome]) -> None:
        """An `ack <topic>` span per answered ack of a delivered attempt, the child of that
        attempt's deliver span: `acked`, or an error status when the engine refused it (the
        lease was gone: the message comes again)."""
        for outcome in outcomes:
            self._settled(topic, "ack", outcome)

    def nacked(self, topic: str, outcomes: list[Outcome]) -> None:
        """A `nack <topic>` span (retry scheduled, `messaging.delayq.retry_due_ms`) or a
        `dead <topic>` span (given up: dead or dropped) per answered nack of a failed
        attempt, the child of that attempt's deliver span: the engine answers after it
        ended, in a batch of nacks."""
        for outcome in outcomes:
            operation = NACK_SPANS.get(outcome.code)
            if operation is None:  # a refused nack (lease lost): the message comes again
                self._awaited.pop(outcome.id, None)
                continue
            self._settled(topic, operation, outcome)

    def _settled(self, topic: str, operation: str, outcome: Outcome) -> None:
        """The span of the engine's answer to an attempt's ack or nack, if the attempt was
        this process's."""
        awaited = self._awaited.pop(outcome.id, None)
        if awaited is None:
            return
        context, slot, attempt = awaited
        self._answer_span(topic, operation, "settle", outcome, slot, context, attempt).end()

    def _lease_span(
        self,
        topic: str,
        operation: str,
        kind: str | None,
        lease: Lease,
        outcome: Outcome,
        claim: tuple[SpanContext, int] | None,
    ) -> Span:
        """The span of a consumer's request about one pull lease: the child of the lease's
        claim span if this process leased it, else a new trace (no attempt: the token does
        not carry it). The caller ends it."""
        context, attempt = claim if claim is not None else (None, None)
        return self._answer_span(topic, operation, kind, outcome, lease.slot, context, attempt)

    def _answer_span(
        self,
        topic: str,
        operation: str,
        kind: str | None,
        outcome: Outcome,
        slot: int,
        parent: SpanContext | None,
        attempt: int | None,
    ) -> Span:
        """The (unended) span of an answer about one message: its id, slot, attempt (when
        known) and the engine's outcome; an error status when the engine refused."""
        from opentelemetry.trace import SpanKind, Status, StatusCode

        attributes = _attributes(topic, operation, kind)
        attributes.update(
            {
                "messaging.message.id": outcome.id,
                "messaging.delayq.slot": slot,
                "messaging.delayq.outcome": outcome.code.name.lower(),
            }
        )
        if attempt is not None:
            attributes["messaging.delayq.attempt"] = attempt
        if outcome.code is Code.RETRY_SCHEDULED and outcome.at_ms is not None:
            attributes["messaging.delayq.retry_due_ms"] = outcome.at_ms
        span = self.tracer.start_span(
            f"{operation} {topic}",
            context=_as_parent(parent),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        if outcome.code.is_error:
            span.set_status(Status(StatusCode.ERROR, outcome.code.name))
        return span

    def _claim_span(self, topic: str, message: Message, lateness_ms: float) -> Span:
        from opentelemetry.trace import SpanKind

        return self.tracer.start_span(
            f"claim {topic}",
            context=_as_parent(None),
            kind=SpanKind.CLIENT,
            links=_links(message),
            attributes=_claimed(topic, "claim", "receive", message, lateness_ms),
        )

    def inject(self, headers: dict[str, str]) -> None:
        """Add the current span's `traceparent` (and `tracestate`) to outgoing HTTP headers."""
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        TraceContextTextMapPropagator().inject(headers)


def _remember(entries: dict[K, V], key: K, value: V) -> None:
    """Keep `value` under `key`, dropping the oldest entry beyond MAX_AWAITED."""
    if len(entries) >= MAX_AWAITED:
        del entries[next(iter(entries))]
    entries[key] = value


def _attributes(topic: str, operation: str, kind: str | None) -> dict[str, str | int]:
    attributes: dict[str, str | int] = {
        "messaging.system": SYSTEM,
        "messaging.destination.name": topic,
        "messaging.operation.name": operation,
    }
    if kind is not None:  # the conventions' operation type, where one fits
        attributes["messaging.operation.type"] = kind
    return attributes


def _claimed(
    topic: str, operation: str, kind: str, message: Message, lateness_ms: float
) -> dict[str, str | int]:
    """The attributes of a claimed message's span."""
    attributes = _attributes(topic, operation, kind)
    attributes.update(
        {
            "messaging.message.id": message.id,
            "messaging.delayq.slot": message.slot,
            "messaging.delayq.attempt": message.attempt,
            "messaging.delayq.lateness_ms": max(0, round(lateness_ms)),
        }
    )
    return attributes


def _links(message: Message) -> list[Link]:
    """A link to the producer's context the message carries, if it carries one."""
    from opentelemetry.trace import Link

    context = _context_of(message.headers)
    return [Link(context)] if context is not None else []


def _context_of(headers: Mapping[str, str] | None) -> SpanContext | None:
    """The producer's span context a message carries, None without one."""
    if not headers or TRACEPARENT not in headers:
        return None
    from opentelemetry.trace import get_current_span
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {TRACEPARENT: headers[TRACEPARENT]}
    if TRACESTATE in headers:
        carrier[TRACESTATE] = headers[TRACESTATE]
    context = get_current_span(TraceContextTextMapPropagator().extract(carrier)).get_span_context()
    return context if context.is_valid else None


def _as_parent(parent: SpanContext | None) -> Context:
    """A context whose span is `parent`, or an empty one: a new trace, whatever is current."""
    from opentelemetry.context import Context
    from opentelemetry.trace import NonRecordingSpan, set_span_in_context

    return Context() if parent is None else set_span_in_context(NonRecordingSpan(parent))
