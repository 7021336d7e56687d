"""Parsing a DelayTopic spec: defaults as in the CRD, and one-line errors naming the field."""

from __future__ import annotations

import pytest

from delayq.kube.builders.common import BuildContext
from delayq.kube.builders.service import topic_file
from delayq.kube.spec import SpecError, parse_duration_ms, parse_spec
from delayq.queue.backoff import Backoff, Jitter
from delayq.queue.topic import EndAction, TopicType
from delayq.service.config import ServiceConfig
from delayq.service.topic_file import TopicFile


def test_spec_defaults_match_the_crd() -> None:
    spec = parse_spec("orders", "shop", {})
    assert (spec.slot_amount, spec.topic_type, spec.brokers, spec.replicas_per_broker) == (
        16,
        TopicType.PULL,
        1,
        1,
    )
    assert (spec.max_retries, spec.ack_timeout_ms, spec.deletion_policy) == (16, 30_000, "Retain")
    assert spec.topic.slot_amount == 16


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"slotAmount": 12}, "power of two"),
        ({"slotAmount": 0}, "slotAmount must be an integer between 1 and 16384"),
        ({"topicType": "kafka"}, "topicType 'kafka' must be one of"),
        ({"brokers": 8, "slotAmount": 4}, "brokers must not exceed slotAmount"),
        ({"topicType": "webhook"}, "needs exactly one of spec.delivery.webhook.url and url"),
        ({"delivery": {"stream": {}}}, "spec.delivery.stream is only used by topicType stream"),
        ({"ackTimeout": "0ms"}, "ackTimeout must be between 1ms and 24h"),
        ({"outcomeRetention": "721h"}, "outcomeRetention must be between 0s and 720h"),
        ({"delivery": {"paused": "yes"}}, "delivery.paused must be true or false"),
        ({"topicType": "webhook",
          "delivery": {"webhook": {"url": "https://h.example/d", "maxBatch": 0}}},
         "delivery.webhook.maxBatch must be an integer between 1 and 1000"),
        ({"maxRetries": True}, "maxRetries must be an integer"),
        ({"zookeeper": {"connect": "not a host"}}, "zookeeper.connect"),
        ({"deletionPolicy": "Orphan"}, "deletionPolicy 'Orphan' must be Retain or Delete"),
        ({"worker": {"concurrency": 0}}, "worker.concurrency must be an integer between 1"),
    ],
)
def test_invalid_specs_name_the_field(spec: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError, match=None) as error:
        parse_spec("orders", "shop", spec)
    assert message in str(error.value)


def test_topic_name_must_be_a_dns_label() -> None:
    with pytest.raises(SpecError, match="DNS label"):
        parse_spec("Orders_1", "shop", {})


@pytest.mark.parametrize(
    ("value", "expected"), [("500ms", 500), ("30s", 30_000), ("1m30s", 90_000), ("1h", 3_600_000)]
)
def test_durations(value: str, expected: int) -> None:
    assert parse_duration_ms(value, "x", 1, 86_400_000) == expected


def test_retry_policy_reaches_the_delay_service() -> None:
    """spec.retry → TopicSpec → topic.json → ServiceConfig.backoff, with the CRD's defaults when
    absent (doubling from 1 s up to 1 h, no jitter)."""
    spec = parse_spec(
        "orders",
        "shop",
        {"retry": {"backoffBase": "250ms", "backoffMax": "2m", "backoffMultiplier": 1.5,
                   "jitter": "full"}},
    )  # fmt: skip
    file = TopicFile.from_json(topic_file(spec, BuildContext(), spec.slot_amount).to_json())
    backoff = ServiceConfig.from_env({}, file.service_settings({})).backoff
    assert backoff == Backoff(250, 1.5, 120_000, Jitter.FULL)
    assert parse_spec("orders", "shop", {}).retry_jitter is Jitter.NONE
    assert (parse_spec("o", "shop", {}).retry_backoff_base_ms, ServiceConfig().backoff) == (
        1000,
        Backoff(1000, 2.0, 3_600_000, Jitter.NONE),
    )


def test_the_request_body_cap_reaches_the_delay_service() -> None:
    """spec.maxBodyBytes → topic.json → `delayq serve --max-body-bytes` (the HTTP API's cap,
    413 above it); 8 MiB when absent. Before it, a topic raising maxPayloadBytes above 6 MiB
    could not take such a payload over HTTP: the pods' cap was fixed."""
    mib = 1024 * 1024
    spec = parse_spec("orders", "shop", {"maxPayloadBytes": 32 * mib, "maxBodyBytes": 48 * mib})
    file = TopicFile.from_json(topic_file(spec, BuildContext(), spec.slot_amount).to_json())
    assert ServiceConfig.from_env({}, file.service_settings({})).max_body_bytes == 48 * mib
    assert parse_spec("orders", "shop", {}).max_body_bytes == 8 * mib
    with pytest.raises(SpecError, match=r"^maxBodyBytes must be an integer between 1024 and "):
        parse_spec("orders", "shop", {"maxBodyBytes": 100})


def test_webhook_batches_reach_the_delay_service() -> None:
    """delivery.webhook.maxBatch → topic.json → ServiceConfig; 1 (one message per POST, what
    every receiver understands) when absent."""
    webhook = {"url": "https://hooks.example/d", "maxBatch": 100}
    spec = parse_spec("orders", "shop", {"topicType": "webhook", "delivery": {"webhook": webhook}})
    file = TopicFile.from_json(topic_file(spec, BuildContext(), spec.slot_amount).to_json())
    assert ServiceConfig.from_env({}, file.service_settings({})).webhook_max_batch == 100
    assert parse_spec("orders", "shop", {}).delivery.webhook_max_batch == 1


def test_end_of_retries_and_expiry_reach_the_engine_topic() -> None:
    """spec.retry.for / exhaustedAction and spec.expiry → topic.json → the served Topic."""
    spec = parse_spec(
        "orders",
        "shop",
        {"retry": {"for": "2h", "exhaustedAction": "drop"},
         "expiry": {"ttl": "10m", "action": "drop"}, "outcomeRetention": "1h"},
    )  # fmt: skip
    file = TopicFile.from_json(topic_file(spec, BuildContext(), spec.slot_amount).to_json())
    topic = ServiceConfig.from_env({}, file.service_settings({})).to_topic()
    assert (topic.retry_for_ms, topic.retry_exhausted_action) == (7_200_000, EndAction.DROP)
    assert (topic.expiry_ttl_ms, topic.expiry_action) == (600_000, EndAction.DROP)
    assert topic.outcome_retention_ms == 3_600_000
    limited = parse_spec("orders", "shop", {"slotAmount": 4, "limits": {"maxPending": 10}})
    assert (limited.topic.limits_max_pending, limited.topic.max_pending_per_slot) == (10, 3)
    default = parse_spec("orders", "shop", {}).topic
    assert (default.retry_for_ms, default.expiry_ttl_ms) == (0, 0)
    assert (default.retry_exhausted_action, default.expiry_action) == (EndAction.DEAD,) * 2


@pytest.mark.parametrize(
    ("retry", "message"),
    [
        ({"backoffBase": "2h", "backoffMax": "1h"}, "retry.backoffMax must not be shorter than"),
        ({"backoffMultiplier": 0.5}, "retry.backoffMultiplier must be a number between 1 and 10"),
        ({"backoffMultiplier": "2"}, "retry.backoffMultiplier must be a number"),
        ({"jitter": "some"}, "retry.jitter 'some' must be none or full"),
        ({"exhaustedAction": "keep"}, "retry.exhaustedAction 'keep' must be dead or drop"),
        ({"for": "1 hour"}, "retry.for"),
        ({"backoffBase": "8d"}, "retry.backoffBase"),
    ],
)
def test_bad_retry_policies_name_the_field(retry: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as error:
        parse_spec("orders", "shop", {"retry": retry})
    assert message in str(error.value)
