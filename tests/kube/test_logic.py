"""Pure operator logic: spec parsing, status diffs and conditions, apply decisions."""

from __future__ import annotations

import pytest

from delayq.kube.apply import contains, update_patch
from delayq.kube.config import OperatorConfig
from delayq.kube.spec import SpecError, parse_duration_ms, parse_spec
from delayq.kube.status import (
    DEGRADED,
    FALSE,
    PROVISIONED,
    READY,
    TRUE,
    Condition,
    merge_conditions,
    ready_condition,
    status_patch,
)
from delayq.queue.topic import TopicType


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
        ({"topicType": "webhook"}, "needs spec.delivery.webhook.url"),
        ({"delivery": {"stream": {}}}, "spec.delivery.stream is only used by topicType stream"),
        ({"ackTimeout": "0ms"}, "ackTimeout must be between 1ms and 24h"),
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


def test_status_patch_is_empty_when_unchanged_and_minimal_otherwise() -> None:
    old = {"observedGeneration": 1, "depths": {"scheduled": 3}, "gone": 1}
    assert status_patch(old, dict(old)) == {}
    new = {"observedGeneration": 2, "depths": {"scheduled": 3}}
    assert status_patch(old, new) == {"observedGeneration": 2, "gone": None}


def test_transition_time_moves_only_when_status_flips() -> None:
    first = merge_conditions([], [Condition(READY, FALSE, "WaitingForBrokers", "m")], "t1", 1)
    same = merge_conditions(first, [Condition(READY, FALSE, "Other", "m2")], "t2", 1)
    assert same[0]["lastTransitionTime"] == "t1"
    assert same[0]["reason"] == "Other"
    flipped = merge_conditions(same, [Condition(READY, TRUE, "Serving", "m3")], "t3", 2)
    assert flipped[0]["lastTransitionTime"] == "t3"
    assert flipped[0]["observedGeneration"] == 2


def test_conditions_keep_a_stable_order() -> None:
    conditions = merge_conditions(
        [],
        [Condition(DEGRADED, FALSE, "A", "a"), Condition(READY, TRUE, "B", "b")],
        "t",
        None,
    )
    assert [c["type"] for c in conditions] == [READY, DEGRADED]
    assert "observedGeneration" not in conditions[0]


def test_ready_summary() -> None:
    ok = Condition(PROVISIONED, TRUE, "ResourcesApplied", "ok")
    healthy = Condition(DEGRADED, FALSE, "AllReplicasReady", "ok")
    sick = Condition(DEGRADED, TRUE, "Degraded", "broker 0 has 0/1 replicas ready.")
    assert ready_condition(ok, healthy, True).reason == "Serving"
    assert ready_condition(ok, healthy, False).status == FALSE
    assert ready_condition(ok, sick, True).reason == "ServingDegraded"
    invalid = Condition(PROVISIONED, FALSE, "InvalidSpec", "bad")
    assert ready_condition(invalid, healthy, True).reason == "InvalidSpec"
    refused = Condition(PROVISIONED, FALSE, "ReshardingNotSupported", "not yet")
    summary = ready_condition(refused, healthy, True)
    assert (summary.status, summary.reason) == (TRUE, "ServingDegraded")
    assert "not yet" in summary.message


def test_contains_ignores_server_defaults_but_not_removals() -> None:
    existing = {"spec": {"a": 1, "list": [{"x": 1, "defaulted": True}], "extra": 2}}
    assert contains(existing, {"spec": {"a": 1, "list": [{"x": 1}]}})
    assert not contains(existing, {"spec": {"a": 2}})
    assert not contains(existing, {"spec": {"list": [{"x": 1}, {"x": 2}]}})


def test_update_patch_leaves_immutable_statefulset_fields_alone() -> None:
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "n", "namespace": "s", "labels": {"a": "b"}, "uid": "x"},
        "spec": {"replicas": 2, "selector": {}, "serviceName": "h", "volumeClaimTemplates": []},
    }
    patch = update_patch(manifest)
    assert patch["spec"] == {"replicas": 2}
    assert patch["metadata"] == {"labels": {"a": "b"}}
    assert "selector" in manifest["spec"]  # the input is not mutated


def test_operator_config_from_env() -> None:
    config = OperatorConfig.from_env(
        {
            "DELAYQ_WATCH_NAMESPACES": "a, b,",
            "DELAYQ_STANDALONE": "true",
            "DELAYQ_ZOOKEEPER": "zk:2181",
            "POD_NAMESPACE": "ops",
            "DELAYQ_FAILOVER_GRACE_S": "5",
        }
    )
    assert config.namespaces == ("a", "b")
    assert not config.clusterwide
    assert config.standalone
    assert config.build.default_zookeeper == "zk:2181"
    assert config.build.operator_namespace == "ops"
    assert config.failover_grace_s == 5.0
    assert OperatorConfig.from_env({}).clusterwide
