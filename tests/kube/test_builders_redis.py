"""The brokers' manifests: the Redis StatefulSet (master plus replicas, AOF, volume and its
retention), memory quantities and maxmemory, the master record and services, and the service
user's ACL line."""

from __future__ import annotations

import re
from typing import Any

import pytest

from delayq.kube import naming
from delayq.kube.builders.redis import (
    REDIS_PRESTOP_SCRIPT,
    REDIS_START_SCRIPT,
    SWITCHOVER_WAIT_S,
    master_endpoint_slice,
    redis_maxmemory,
)
from delayq.kube.quantity import (
    MAX_QUANTITY,
    MAX_QUANTITY_LENGTH,
    QUANTITY_PATTERN,
    memory_bytes,
    parse_quantity,
)
from delayq.kube.spec import STREAM_KEY_ENGINE_MESSAGE, SpecError, TopicSpec
from tests.kube.manifests import by_kind_name, rendered, spec_of
from tests.kube.test_crd_schema import crd


def test_redis_statefulset_master_plus_replicas_with_aof_and_volume() -> None:
    spec = spec_of(
        brokers=2, replicasPerBroker=2, persistence={"size": "5Gi", "storageClass": "ssd"}
    )
    sts = by_kind_name(rendered(spec))["StatefulSet", "orders-redis-1"]
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["serviceName"] == "orders-redis-1-headless"
    assert sts["spec"]["selector"]["matchLabels"][naming.LABEL_BROKER] == "1"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["storageClassName"] == "ssd"
    assert claim["metadata"]["labels"][naming.LABEL_TOPIC] == "orders"
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert "--appendonly yes" in container["command"][2]
    env = {item["name"]: item for item in container["env"]}
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "orders-credentials",
        "key": naming.SECRET_REDIS_PASSWORD,
    }
    assert env["MASTER_HOST"]["value"] == "orders-redis-1.shop.svc"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512Mi", 512 * 2**20),
        ("1Gi", 2**30),
        ("1.5Gi", 3 * 2**29),
        ("2Ki", 2048),
        ("1G", 10**9),
        ("500M", 5 * 10**8),
        ("1k", 1000),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1E", 10**18),
        ("2Ei", 2 * 2**60),
        ("134217728", 2**27),
        (".5Ki", 512),
        ("100m", 1),  # 0.1 byte, rounded up as Kubernetes does
        (" 1Mi ", 2**20),
    ],
)
def test_memory_quantities_in_bytes(text: str, expected: int) -> None:
    assert memory_bytes(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Mi",
        "1MB",
        "1 Gi",
        "1gi",
        "0x10",
        "1.2.3",
        "e3",
        "1e",
        "1e100",
        "1e-100",
        "1e999999999",
        "1" * 65,
    ],
)
def test_not_a_quantity_is_refused_naming_it(text: str) -> None:
    """Besides the grammar, delayq's bounds: 64 characters, a two-digit exponent (a tenant's
    `1e999999999` has a billion-digit exact value)."""
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["1e99", "8Ei", "9" * 64])
def test_a_quantity_beyond_the_api_servers_range_is_capped_as_it_caps_it(text: str) -> None:
    assert memory_bytes(text) == MAX_QUANTITY
    assert parse_quantity(f"-{text}"[:64]) == -MAX_QUANTITY


def test_the_crds_quantity_rule_is_the_parsers() -> None:
    """The API server checks the grammar and the bounds the parser does: the CRD's pattern and
    maxLength are quantity.py's, on every resource value a tenant writes."""
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]["properties"]
    for owner in ("worker", "redis"):
        for key in ("requests", "limits"):
            values = spec[owner]["properties"]["resources"]["properties"][key][
                "additionalProperties"
            ]
            assert (values["pattern"], values["maxLength"]) == (
                QUANTITY_PATTERN,
                MAX_QUANTITY_LENGTH,
            )
    pattern = re.compile(QUANTITY_PATTERN)
    for text in ("512Mi", "1.5G", "1e3", "1E", ".5Ki", "1e99", "1e100", "1MB", "1 Gi"):
        assert bool(pattern.match(text)) == _parses(text), text


def _parses(text: str) -> bool:
    try:
        parse_quantity(text)
    except ValueError:
        return False
    return True


def test_maxmemory_is_80_percent_of_the_memory_limit_or_unbounded_without_one() -> None:
    assert redis_maxmemory({"memory": "512Mi"}) == 429496729
    assert redis_maxmemory({"memory": "1Gi", "cpu": "2"}) == 858993459
    assert redis_maxmemory({"memory": "1G"}) == 800_000_000
    assert redis_maxmemory({"cpu": "2"}) == 0
    assert redis_maxmemory({}) == 0
    assert redis_maxmemory({"memory": "lots"}) == 0  # the API server refuses it, naming it


def redis_container(spec: TopicSpec, broker: int = 0) -> dict[str, Any]:
    sts = by_kind_name(rendered(spec))["StatefulSet", f"orders-redis-{broker}"]
    container: dict[str, Any] = sts["spec"]["template"]["spec"]["containers"][0]
    return container


@pytest.mark.parametrize(
    ("redis", "maxmemory"),
    [
        ({}, "429496729"),  # the default limit, 512Mi
        ({"resources": {"limits": {"memory": "2Gi"}}}, "1717986918"),
        ({"resources": {"requests": {"memory": "4Gi"}, "limits": {"cpu": "1"}}}, "0"),
    ],
)
def test_redis_maxmemory_follows_the_memory_limit_with_noeviction(
    redis: dict[str, Any], maxmemory: str
) -> None:
    container = redis_container(spec_of(brokers=2, redis=redis), broker=1)
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["MAXMEMORY"] == maxmemory
    script = container["command"][2]
    assert "--maxmemory $MAXMEMORY --maxmemory-policy noeviction" in script
    assert script == REDIS_START_SCRIPT


def test_redis_start_script_reads_role_from_the_master_record_and_hides_password() -> None:
    assert 'if [ "${MASTER_POD:-}" = "$POD_NAME/$POD_UID" ]; then' in REDIS_START_SCRIPT
    assert "--replicaof $MASTER_HOST" in REDIS_START_SCRIPT
    assert "--requirepass" not in REDIS_START_SCRIPT  # the password goes through stdin


def test_a_stopping_master_waits_for_the_switchover_within_its_grace_period() -> None:
    sts = by_kind_name(rendered(spec_of()))["StatefulSet", "orders-redis-0"]
    pod = sts["spec"]["template"]["spec"]
    hook = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert hook == ["sh", "-c", REDIS_PRESTOP_SCRIPT]
    assert f"+ {SWITCHOVER_WAIT_S} ))" in REDIS_PRESTOP_SCRIPT  # bounded
    assert pod["terminationGracePeriodSeconds"] > SWITCHOVER_WAIT_S  # Redis still shuts down


@pytest.mark.parametrize(("policy", "expected"), [("Retain", "Retain"), ("Delete", "Delete")])
def test_volume_retention_follows_deletion_policy(policy: str, expected: str) -> None:
    sts = by_kind_name(rendered(spec_of(deletionPolicy=policy)))["StatefulSet", "orders-redis-0"]
    retention = sts["spec"]["persistentVolumeClaimRetentionPolicy"]
    assert retention == {"whenDeleted": expected, "whenScaled": "Retain"}


def test_master_service_has_no_selector_and_headless_selects_all() -> None:
    """The master Service's endpoint is the operator's EndpointSlice: no pod label to patch."""
    items = by_kind_name(rendered())
    master = items["Service", "orders-redis-0"]["spec"]
    assert "selector" not in master
    assert master["ports"] == [{"name": "redis", "port": naming.REDIS_PORT, "targetPort": "redis"}]
    headless = items["Service", "orders-redis-0-headless"]["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["selector"] == naming.redis_selector("orders", 0)
    assert not [kind for kind, _ in items if kind == "EndpointSlice"]  # the health pass's


@pytest.mark.parametrize(
    ("address", "family", "endpoints"),
    [("10.0.0.7", "IPv4", 1), ("fd00::7", "IPv6", 1), (None, None, 0)],
)
def test_the_master_slice_names_the_master_in_its_address_family(
    address: str | None, family: str | None, endpoints: int
) -> None:
    slice_ = master_endpoint_slice(spec_of(), 0, "orders-redis-0-1", address, ready=True)
    labels = slice_["metadata"]["labels"]
    assert labels[naming.LABEL_SERVICE_NAME] == naming.redis_master_service("orders", 0)
    assert labels[naming.LABEL_SLICE_MANAGED_BY] == "delayq.io-operator"
    assert slice_.get("addressType") == family  # immutable: never guessed without an IP
    assert len(slice_["endpoints"]) == endpoints
    if address:
        (endpoint,) = slice_["endpoints"]
        assert endpoint["addresses"] == [address]
        assert endpoint["targetRef"]["name"] == "orders-redis-0-1"


def test_redis_pods_learn_their_role_from_the_master_record() -> None:
    sts = by_kind_name(rendered())["StatefulSet", "orders-redis-0"]["spec"]["template"]["spec"]
    env = {item["name"]: item for item in sts["containers"][0]["env"]}
    assert env["MASTER_POD"]["valueFrom"]["configMapKeyRef"] == {
        "name": naming.redis_masters_config_map("orders"),
        "key": naming.master_key(0),
        "optional": True,
    }
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert [volume["name"] for volume in sts["volumes"]] == ["tmp"]  # no labels file


@pytest.mark.parametrize("key", ["a b", 'a"b', "a'b", "a\\b", "dq:*", "a?", "a[0]", "tab\there"])
def test_a_stream_key_that_would_break_the_redis_acl_line_is_refused(key: str) -> None:
    with pytest.raises(SpecError, match=r"^delivery\.stream\.streamKey must not contain"):
        spec_of(topicType="stream", delivery={"stream": {"streamKey": key}})


@pytest.mark.parametrize(
    "key", ["dq-settings:{shop/orders/0}", "dq:{shop/orders}:pace", "dq:{shop/other/0}:store"]
)
def test_a_stream_key_inside_the_engines_key_space_is_refused(key: str) -> None:
    """The ACL grants the stream key and the stream's consumers create it: one of the engine's
    keys would let them write the read-only settings or stall the topic with WRONGTYPE."""
    with pytest.raises(SpecError) as raised:
        spec_of(topicType="stream", delivery={"stream": {"streamKey": key}})
    assert str(raised.value) == f"{STREAM_KEY_ENGINE_MESSAGE} (streamKey={key!r})"


def test_the_stream_key_is_the_service_users_only_extra_key() -> None:
    spec = spec_of(topicType="stream", delivery={"stream": {"streamKey": "orders:due"}})
    env = {
        item["name"]: item.get("value", "")
        for item in by_kind_name(rendered(spec))["StatefulSet", "orders-redis-0"]["spec"][
            "template"
        ]["spec"]["containers"][0]["env"]
    }
    patterns = [rule for rule in env["SERVICE_USER_RULES"].split() if rule.startswith("~")]
    assert patterns == ["~dq:{shop/orders/*", "~dq:{shop/orders}:*", "~orders:due"]
