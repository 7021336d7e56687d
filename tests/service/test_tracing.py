"""Traces: a message's W3C trace context from the producer, through a real `delayq serve`, to
a real webhook receiver, and the spans exported to a real OTLP/HTTP receiver.

The receiver is OTLP/HTTP decoded with `opentelemetry-proto` (the protocol's own generated
messages) rather than the OpenTelemetry Collector: the Collector is a Go build of several
minutes on CI's two cores, and no container registry is reachable to pull its image. What is
tested is what the Collector would be sent: the protobuf export request on `/v1/traces`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from delayq.local.ports import free_port
from delayq.local.processes import ServeProcess
from delayq.local.redis_server import RedisServer
from delayq.local.waiting import eventually
from delayq.queue.topic import TopicType
from delayq.service import tracing
from delayq.service.api import build_app
from delayq.service.config import ServiceConfig
from delayq.service.serve import run
from delayq.service.service import DelayService
from delayq.service.tracing import Tracing
from tests.service.conftest import Receiver, StartService

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PRODUCER_SPAN_ID = "00f067aa0ba902b7"
# what only tracing loads (service/tracing.py imports them when on)
TRACING_ONLY = (
    "opentelemetry.sdk.trace",
    "opentelemetry.exporter",
    "opentelemetry.trace.propagation.tracecontext",
)
TRACEPARENT = f"00-{TRACE_ID}-{PRODUCER_SPAN_ID}-01"


@dataclass
class OtlpReceiver:
    """A real OTLP/HTTP trace receiver on loopback: every span of every export request."""

    url: str = ""
    spans: list[Span] = field(default_factory=list)

    def named(self, prefix: str) -> list[Span]:
        return [span for span in self.spans if span.name.startswith(prefix)]


@pytest.fixture
async def otlp() -> AsyncIterator[OtlpReceiver]:
    received = OtlpReceiver()

    async def export(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                received.spans.extend(scope.spans)
        reply = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=reply, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", export)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    received.url = f"http://127.0.0.1:{port}"
    try:
        yield received
    finally:
        await runner.cleanup()


def attributes(span: Span) -> dict[str, Any]:
    def value(any_value: AnyValue) -> Any:
        return getattr(any_value, any_value.WhichOneof("value") or "string_value")

    return {attribute.key: value(attribute.value) for attribute in span.attributes}


async def test_a_message_is_traced_from_producer_to_receiver(
    redis_server: RedisServer, receiver: Receiver, otlp: OtlpReceiver, tmp_path: Path
):
    """The producer's `traceparent` HTTP header is stored with the message; the collector
    gets a schedule span, child of the producer's span, and for each attempt a trace of its
    own *linking* the producer's: the claim span, its child deliver span (the message's id,
    topic, slot, attempt and lateness on both), and the deliver span's child ack (or nack,
    dead) span, the engine's answer; the receiver's POST carries the deliver span's context
    as `traceparent` and the producer's in the body's headers."""
    config = ServiceConfig(
        redis_url=redis_server.url,
        topic="traced",
        slot_amount=4,
        port=free_port(),
        topic_type=TopicType.WEBHOOK,
        webhook_url=receiver.url,
        max_retries=1,
        retry_backoff_base_ms=50,
    )

    async def only_the_first_succeeds(call: int) -> int:
        return 200 if call == 1 else 500

    receiver.answer = only_the_first_succeeds
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    process = ServeProcess(config, tmp_path / "serve.log", extra_env=env).start()
    try:
        async with aiohttp.ClientSession() as session:
            await eventually(lambda: _ready(session, process), 15, "delayq serve ready")
            async with session.post(
                f"{process.url}/v1/topics/traced/messages",
                json={"id": "order-7", "delayMs": 50, "payload": "hi"},
                headers={"traceparent": TRACEPARENT, "tracestate": "shop=1"},
            ) as answer:
                assert answer.status == 201, await answer.text()
                slot = (await answer.json())["slot"]
            await eventually(lambda: len(receiver.requests) == 1, 10, "the POST")
            async with session.post(  # refused twice: retried once, then dead
                f"{process.url}/v1/topics/traced/messages",
                json={"id": "order-8", "delayMs": 0, "headers": {"traceparent": TRACEPARENT}},
            ) as answer:
                assert answer.status == 201, await answer.text()
            await eventually(lambda: otlp.named("dead"), 10, "the dead span exported")
            await eventually(lambda: otlp.named("ack"), 10, "the ack span exported")
    finally:
        process.terminate()
        assert process.wait(10) == 0, process.log_path.read_text()

    [schedule, _] = otlp.named("schedule traced")
    assert schedule.trace_id.hex() == TRACE_ID  # the producer's trace: its child
    assert schedule.parent_span_id.hex() == PRODUCER_SPAN_ID
    assert schedule.kind == Span.SPAN_KIND_PRODUCER
    assert attributes(schedule) == {
        "messaging.system": "delayq",
        "messaging.destination.name": "traced",
        "messaging.operation.name": "schedule",
        "messaging.operation.type": "send",
        "messaging.message.id": "order-7",
        "messaging.delayq.slot": slot,
    }

    [claim, *claims_failed] = otlp.named("claim traced")
    assert claim.trace_id.hex() != TRACE_ID  # a trace of its own (the wait may be a year)
    assert claim.parent_span_id == b""
    assert claim.kind == Span.SPAN_KIND_CLIENT
    [deliver, *failed] = otlp.named("deliver traced")
    assert (deliver.trace_id, deliver.parent_span_id) == (claim.trace_id, claim.span_id)
    assert deliver.kind == Span.SPAN_KIND_CONSUMER
    for span, operation, kind in ((claim, "claim", "receive"), (deliver, "deliver", "process")):
        [link] = span.links
        assert (link.trace_id.hex(), link.span_id.hex()) == (TRACE_ID, PRODUCER_SPAN_ID)
        found = attributes(span)
        assert found["messaging.message.id"] == "order-7"
        assert found["messaging.destination.name"] == "traced"
        assert (found["messaging.operation.name"], found["messaging.operation.type"]) == (
            operation,
            kind,
        )
        assert found["messaging.delayq.slot"] == slot
        assert found["messaging.delayq.attempt"] == 1
        assert 0 <= found["messaging.delayq.lateness_ms"] < 5000
    assert (
        attributes(claim)["messaging.delayq.lateness_ms"]
        <= attributes(deliver)["messaging.delayq.lateness_ms"]
    )
    assert attributes(deliver)["messaging.delayq.outcome"] == "ack"
    assert deliver.status.code == deliver.status.STATUS_CODE_OK
    [ack] = otlp.named("ack traced")
    assert (ack.trace_id, ack.parent_span_id) == (deliver.trace_id, deliver.span_id)
    assert ack.kind == Span.SPAN_KIND_CLIENT
    assert attributes(ack) == {
        "messaging.system": "delayq",
        "messaging.destination.name": "traced",
        "messaging.operation.name": "ack",
        "messaging.operation.type": "settle",
        "messaging.message.id": "order-7",
        "messaging.delayq.slot": slot,
        "messaging.delayq.attempt": 1,
        "messaging.delayq.outcome": "acked",
    }
    assert ack.status.code != Status.STATUS_CODE_ERROR

    headers, body = receiver.requests[0]
    # the deliver span's context (its flags: sampled, and random trace id in W3C level 2)
    assert headers["traceparent"].startswith(
        f"00-{deliver.trace_id.hex()}-{deliver.span_id.hex()}-"
    )
    sent = json.loads(body)["headers"]
    assert sent == {"traceparent": TRACEPARENT, "tracestate": "shop=1"}

    # order-8's attempts: each a claim, its deliver span that failed, then the nack's span
    assert [attributes(span)["messaging.delayq.attempt"] for span in failed] == [1, 2]
    for claimed, delivered in zip(claims_failed, failed, strict=True):
        assert attributes(claimed)["messaging.message.id"] == "order-8"
        assert delivered.parent_span_id == claimed.span_id
    assert {attributes(span)["messaging.delayq.outcome"] for span in failed} == {"nack"}
    assert {span.status.code for span in failed} == {Status.STATUS_CODE_ERROR}
    [nack] = otlp.named("nack traced")
    [dead] = otlp.named("dead traced")
    for settled, attempt, outcome in ((nack, 1, "retry_scheduled"), (dead, 2, "dead")):
        assert settled.parent_span_id == failed[attempt - 1].span_id
        assert settled.trace_id == failed[attempt - 1].trace_id
        assert attributes(settled)["messaging.message.id"] == "order-8"
        assert attributes(settled)["messaging.delayq.attempt"] == attempt
        assert attributes(settled)["messaging.delayq.outcome"] == outcome
        assert attributes(settled)["messaging.operation.type"] == "settle"
    assert attributes(nack)["messaging.delayq.retry_due_ms"] > 0
    _print_trace(otlp.spans)
    print("webhook POST traceparent:", headers["traceparent"], "body headers:", sent)


async def _ready(session: aiohttp.ClientSession, process: ServeProcess) -> bool:
    assert process.running(), process.log_path.read_text()
    try:
        async with session.get(process.url + "/readyz") as answer:
            return answer.status == 200
    except aiohttp.ClientError:
        return False


@pytest.mark.parametrize(
    ("body", "headers", "field"),
    [
        ({"headers": {"traceparent": "00-abc-01"}}, {}, "headers.traceparent"),
        ({}, {"traceparent": "00-" + "0" * 32 + "-00f067aa0ba902b7-01"}, "traceparent"),
        ({}, {"tracestate": "shop=1"}, "tracestate"),
        (
            {"headers": {"traceparent": TRACEPARENT, "tracestate": "a=b\u00e9"}},
            {},
            "headers.tracestate",
        ),
    ],
)
async def test_a_malformed_trace_context_is_a_400_naming_it(
    start_service: StartService, body: dict[str, Any], headers: dict[str, str], field: str
):
    running = await start_service()
    answer = await running.client.post(
        running.base + "/messages", json={"id": "m", "delayMs": 0, **body}, headers=headers
    )
    assert answer.status == 400
    assert (await answer.json())["field"] == field


async def test_untraced_deliveries_send_no_traceparent(
    start_service: StartService, receiver: Receiver
):
    """Tracing off (the default): a message given a context keeps it in its headers, and
    the POST has no `traceparent` of delayq's (it never makes the receiver a child of a
    producer's span a wait ago)."""
    running = await start_service(topic_type="webhook", webhook_url=receiver.url)
    assert running.service.tracing is None
    answer = await running.client.post(
        running.base + "/messages",
        json={"id": "m", "delayMs": 0},
        headers={"traceparent": TRACEPARENT},
    )
    assert answer.status == 201, await answer.text()
    await eventually(lambda: len(receiver.requests) == 1, 10, "the POST")
    headers, body = receiver.requests[0]
    assert "traceparent" not in {name.lower() for name in headers}
    assert json.loads(body)["headers"] == {"traceparent": TRACEPARENT}


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "shop"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
    ],
)
def test_tracing_is_off_unless_the_otel_variables_ask_for_an_otlp_export(env, on):
    assert (Tracing.from_env(env) is not None) is on


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin'"),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "'grpc'"),
    ],
)
def test_an_export_delayq_cannot_make_is_a_one_line_start_up_error(monkeypatch, capsys, env, named):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert run(ServiceConfig()) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert named in json.loads(line)["msg"]


def test_asked_to_trace_without_the_extra_is_one_line_naming_it(monkeypatch, capsys):
    """A pod given the platform's OTEL_* variables by an image without `[tracing]` says so
    in one line (its log) rather than a traceback."""
    monkeypatch.setattr(tracing, "TRACING_MODULES", ("opentelemetry.sdk", "delayq_not_here"))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-collector:4318")
    assert run(ServiceConfig()) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "delayq_not_here not installed" in json.loads(line)["msg"]
    assert "pip install 'delayq[tracing]'" in json.loads(line)["msg"]


def test_serving_without_tracing_loads_no_tracer():
    """Off is free: `delayq serve`'s modules load neither OpenTelemetry's SDK tracer, nor its
    exporter, nor its propagator (redis-py, when OpenTelemetry is installed, loads parts of
    the API and the SDK's metrics for hooks of its own: those are not delayq's)."""
    code = (
        "import sys, delayq.cli, delayq.service.serve, delayq.service.api;"
        f"print(sorted(m for m in sys.modules if m.startswith({TRACING_ONLY!r})))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == "[]"


async def test_a_pull_lease_is_a_claim_span_and_its_ack_nack_extend_its_children(
    redis_server: RedisServer, otlp: OtlpReceiver, monkeypatch
):
    """A pull topic's lease answer carries the producer's context in the message's headers,
    and each leased message is a `claim` span linking it; the consumer's extend, ack (by the
    ack route or on its next lease), nack and nack to dead over HTTP are spans, the children
    of the lease's claim span, as a push attempt's are of its deliver span. An ack this
    process holds no claim of (the lease already acked: refused) is a trace of its own, an
    error."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url)
    traced = Tracing.from_env(os.environ)
    assert traced is not None
    config = ServiceConfig(
        redis_url=redis_server.url, topic="pulled", slot_amount=4, topic_type=TopicType.PULL
    )
    service = DelayService(config, tracing=traced)
    await service.start()
    client = TestClient(TestServer(build_app(service)))
    await client.start_server()
    leases = "/v1/topics/pulled/leases"
    leased: dict[str, dict[str, Any]] = {}
    slot: dict[str, int] = {}
    try:
        for message_id in ("p-1", "p-2", "p-3", "p-4"):
            answer = await client.post(
                "/v1/topics/pulled/messages",
                json={"id": message_id, "delayMs": 0, "headers": {"traceparent": TRACEPARENT}},
            )
            assert answer.status == 201, await answer.text()
            slot[message_id] = (await answer.json())["slot"]
        async with asyncio.timeout(15):  # a long poll answers when any is due: until all are
            while len(leased) < 4:
                answer = await client.post(leases, json={"max": 4, "waitMs": 5000})
                leased.update({m["id"]: m for m in (await answer.json())["leases"]})
        token = {message_id: m["token"] for message_id, m in leased.items()}
        for path, json_body, status in (
            ("/extend", {"tokens": [token["p-1"]], "ackTimeoutMs": 60_000}, 200),
            ("/ack", {"tokens": [token["p-1"]]}, 200),
            ("/nack", {"tokens": [token["p-2"]], "delayMs": 60_000}, 200),
            ("/nack", {"tokens": [token["p-4"]], "dead": True}, 200),
            ("", {"ack": [token["p-3"]], "max": 1}, 200),  # acked on the next lease
            ("/ack", {"tokens": [token["p-1"]]}, 409),  # again: the lease is gone
        ):
            answer = await client.post(leases + path, json=json_body)
            assert answer.status == status, await answer.text()
    finally:
        await service.stop()  # flushes the spans
        await client.close()
    assert leased["p-1"]["headers"] == {"traceparent": TRACEPARENT}
    claims = {attributes(span)["messaging.message.id"]: span for span in otlp.named("claim")}
    assert sorted(claims) == ["p-1", "p-2", "p-3", "p-4"]
    for message_id, claim in claims.items():
        assert claim.kind == Span.SPAN_KIND_CLIENT
        assert claim.parent_span_id == b""
        [link] = claim.links
        assert (link.trace_id.hex(), link.span_id.hex()) == (TRACE_ID, PRODUCER_SPAN_ID)
        assert attributes(claim)["messaging.operation.type"] == "receive"
        assert attributes(claim)["messaging.delayq.attempt"] == 1
        assert attributes(claim)["messaging.delayq.slot"] == slot[message_id]

    def child_of_claim(name: str, message_id: str, outcome: str) -> dict[str, Any]:
        [span] = [s for s in otlp.named(name) if s.parent_span_id]
        claim = claims[message_id]
        assert (span.trace_id, span.parent_span_id) == (claim.trace_id, claim.span_id)
        assert span.kind == Span.SPAN_KIND_CLIENT
        assert span.status.code != Status.STATUS_CODE_ERROR
        found = attributes(span)
        assert found["messaging.message.id"] == message_id
        assert found["messaging.delayq.slot"] == slot[message_id]
        assert found["messaging.delayq.attempt"] == 1
        assert found["messaging.delayq.outcome"] == outcome
        return found

    extended = child_of_claim("extend pulled", "p-1", "extended")
    assert extended["messaging.delayq.ack_timeout_ms"] == 60_000
    assert "messaging.operation.type" not in extended  # none of the conventions' fits
    assert (
        child_of_claim("nack pulled", "p-2", "retry_scheduled")["messaging.delayq.retry_due_ms"] > 0
    )
    child_of_claim("dead pulled", "p-4", "dead")
    acks = [span for span in otlp.named("ack pulled") if span.parent_span_id]
    assert sorted(attributes(span)["messaging.message.id"] for span in acks) == ["p-1", "p-3"]
    for ack in acks:
        message_id = attributes(ack)["messaging.message.id"]
        assert (ack.trace_id, ack.parent_span_id) == (
            claims[message_id].trace_id,
            claims[message_id].span_id,
        )
        assert attributes(ack)["messaging.operation.type"] == "settle"
        assert attributes(ack)["messaging.delayq.outcome"] == "acked"
        assert attributes(ack)["messaging.delayq.attempt"] == 1
    [refused] = [span for span in otlp.named("ack pulled") if not span.parent_span_id]
    assert refused.trace_id not in {claim.trace_id for claim in claims.values()}
    assert refused.status.code == Status.STATUS_CODE_ERROR
    assert attributes(refused)["messaging.delayq.outcome"] == "lease_lost"
    assert "messaging.delayq.attempt" not in attributes(refused)  # not in the token
    _print_trace(otlp.spans)


def _print_trace(spans: list[Span]) -> None:
    """The spans as the receiver got them (shown with -s)."""
    for span in spans:
        links = [f"{link.trace_id.hex()}/{link.span_id.hex()}" for link in span.links]
        print(
            span.name,
            f"trace={span.trace_id.hex()} span={span.span_id.hex()}",
            f"parent={span.parent_span_id.hex() or '-'} links={links}",
            attributes(span),
        )
