"""Every manifest the operator renders: names, labels, owner refs, probes, security, policy."""

from __future__ import annotations

import json
from typing import Any

import pytest

from delayq.kube import naming
from delayq.kube.builders.bundle import build_all, render
from delayq.kube.builders.common import BuildContext, Credentials
from delayq.kube.builders.redis import REDIS_START_SCRIPT, redis_maxmemory
from delayq.kube.builders.service import config_hash
from delayq.kube.quantity import memory_bytes, parse_quantity
from delayq.kube.spec import SpecError, TopicSpec, parse_spec
from delayq.service.topic_file import TopicFile

CTX = BuildContext(image="delayq:test", redis_image="redis:test", operator_namespace="ops")
CREDS = Credentials(
    redis_password="pw", api_token="tok", zookeeper_password="zk", redis_admin_password="admin"
)
OWNER = {
    "apiVersion": "delayq.io/v1alpha1",
    "kind": "DelayTopic",
    "metadata": {"name": "orders", "namespace": "shop", "uid": "uid-1", "labels": {"team": "a"}},
}


def spec_of(**fields: Any) -> TopicSpec:
    return parse_spec("orders", "shop", fields)


def rendered(spec: TopicSpec | None = None, monitor: bool = False) -> list[dict[str, Any]]:
    spec = spec or spec_of(brokers=2, replicasPerBroker=2)
    return render(OWNER, spec, CTX, CREDS, spec.slot_amount, monitor)


def by_kind_name(manifests: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(m["kind"], m["metadata"]["name"]): m for m in manifests}


def pod_specs(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m["spec"]["template"]["spec"] for m in manifests if m["kind"] == "StatefulSet"]


def test_inventory_per_broker_and_per_topic() -> None:
    names = set(by_kind_name(rendered()))
    expected = {
        ("Secret", "orders-credentials"),
        ("ConfigMap", "orders-config"),
        ("NetworkPolicy", "orders-redis"),
        ("Service", "orders-service-headless"),
        ("Service", "orders-api"),
        ("StatefulSet", "orders-service"),
        ("PodDisruptionBudget", "orders-service"),
    }
    for broker in (0, 1):
        expected |= {
            ("Service", f"orders-redis-{broker}-headless"),
            ("Service", f"orders-redis-{broker}"),
            ("StatefulSet", f"orders-redis-{broker}"),
            ("PodDisruptionBudget", f"orders-redis-{broker}"),
        }
    assert names == expected


def test_service_monitor_only_when_requested() -> None:
    assert ("ServiceMonitor", "orders-api") not in by_kind_name(rendered(monitor=False))
    monitor = by_kind_name(rendered(monitor=True))["ServiceMonitor", "orders-api"]
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    api = by_kind_name(rendered())["Service", "orders-api"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= api["metadata"]["labels"].items()
    headless = by_kind_name(rendered())["Service", "orders-service-headless"]
    assert not selector.items() <= headless["metadata"]["labels"].items()  # scraped once


def test_every_child_is_owned_labelled_and_namespaced() -> None:
    for manifest in rendered(monitor=True):
        meta = manifest["metadata"]
        assert meta["namespace"] == "shop"
        (owner,) = meta["ownerReferences"]
        assert owner["uid"] == "uid-1"
        assert owner["kind"] == "DelayTopic"
        assert owner["controller"] is True
        assert owner["blockOwnerDeletion"] is True
        assert meta["labels"][naming.LABEL_TOPIC] == "orders"
        assert meta["labels"][naming.LABEL_MANAGED_BY] == naming.MANAGED_BY
        assert meta["labels"]["team"] == "a"  # the owner's labels propagate (kopf.adopt)


def test_selectors_match_pod_templates() -> None:
    for manifest in rendered():
        if manifest["kind"] == "StatefulSet":
            selector = manifest["spec"]["selector"]["matchLabels"]
            labels = manifest["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items()


def test_pods_run_non_root_with_read_only_root_and_no_capabilities() -> None:
    for pod in pod_specs(rendered()):
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"] == {"drop": ["ALL"]}
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_pods_have_probes_and_resources() -> None:
    for pod in pod_specs(rendered()):
        for container in pod["containers"]:
            assert container["readinessProbe"]
            assert container["livenessProbe"]
            assert container["resources"]["requests"]
            assert container["resources"]["limits"]["memory"]


def test_user_resources_win_over_defaults() -> None:
    spec = spec_of(
        worker={"resources": {"requests": {"cpu": "2"}, "limits": {"memory": "1Gi"}}},
        redis={"resources": {"requests": {"memory": "4Gi"}}},
    )
    items = by_kind_name(rendered(spec))
    service = items["StatefulSet", "orders-service"]["spec"]["template"]["spec"]["containers"][0]
    assert service["resources"] == {"requests": {"cpu": "2"}, "limits": {"memory": "1Gi"}}
    redis = items["StatefulSet", "orders-redis-0"]["spec"]["template"]["spec"]["containers"][0]
    assert redis["resources"]["requests"] == {"memory": "4Gi"}
    assert redis["resources"]["limits"] == {"memory": "512Mi"}


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


@pytest.mark.parametrize("text", ["", "Mi", "1MB", "1 Gi", "1gi", "0x10", "1.2.3", "e3", "1e"])
def test_not_a_quantity_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


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


def test_redis_start_script_reads_role_from_labels_and_hides_password() -> None:
    assert '^delayq.io/redis-role="master"$' in REDIS_START_SCRIPT
    assert "--replicaof $MASTER_HOST" in REDIS_START_SCRIPT
    assert "--requirepass" not in REDIS_START_SCRIPT  # the password goes through stdin


@pytest.mark.parametrize(("policy", "expected"), [("Retain", "Retain"), ("Delete", "Delete")])
def test_volume_retention_follows_deletion_policy(policy: str, expected: str) -> None:
    sts = by_kind_name(rendered(spec_of(deletionPolicy=policy)))["StatefulSet", "orders-redis-0"]
    retention = sts["spec"]["persistentVolumeClaimRetentionPolicy"]
    assert retention == {"whenDeleted": expected, "whenScaled": "Retain"}


def test_master_service_selects_by_role_label_and_headless_selects_all() -> None:
    items = by_kind_name(rendered())
    master = items["Service", "orders-redis-0"]["spec"]
    assert master["selector"][naming.LABEL_ROLE] == naming.ROLE_MASTER
    assert master["selector"][naming.LABEL_BROKER] == "0"
    headless = items["Service", "orders-redis-0-headless"]["spec"]
    assert headless["clusterIP"] == "None"
    assert naming.LABEL_ROLE not in headless["selector"]


def test_service_statefulset_one_pod_per_broker_with_affinity_and_spread() -> None:
    sts = by_kind_name(rendered(spec_of(brokers=4, slotAmount=16)))["StatefulSet", "orders-service"]
    assert sts["spec"]["replicas"] == 4
    affinity = sts["spec"]["template"]["spec"]["affinity"]
    near = affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert near["podAffinityTerm"]["labelSelector"]["matchLabels"][naming.LABEL_ROLE] == "master"
    apart = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert apart["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        apart["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == sts["spec"]["selector"]["matchLabels"]
    )
    redis_affinity = by_kind_name(rendered())["StatefulSet", "orders-redis-0"]["spec"]["template"][
        "spec"
    ]["affinity"]
    assert redis_affinity["podAntiAffinity"]


def test_config_map_carries_the_topic_contract() -> None:
    spec = spec_of(
        topicType="webhook", delivery={"webhook": {"url": "https://x.example/h"}}, maxRetries=3
    )
    config = json.loads(
        by_kind_name(rendered(spec))["ConfigMap", "orders-config"]["data"]["topic.json"]
    )
    assert config["topic"] == "orders"
    assert config["namespace"] == "shop"
    assert config["slot_amount"] == 16
    assert config["max_retries"] == 3
    assert config["webhook_url"] == "https://x.example/h"
    assert config["zookeeper_connect"] == CTX.default_zookeeper
    assert config["redis_master_host_template"] == "orders-redis-{broker}.shop.svc"
    text = by_kind_name(rendered(spec))["ConfigMap", "orders-config"]["data"]["topic.json"]
    assert TopicFile.from_json(text).to_json() == text  # what `delayq serve --config` reads


def topic_json(spec: TopicSpec) -> dict[str, Any]:
    text = by_kind_name(rendered(spec))["ConfigMap", "orders-config"]["data"]["topic.json"]
    document: dict[str, Any] = json.loads(text)
    return document


def test_webhook_targets_are_refused_unless_the_topic_allows_them() -> None:
    """The SSRF guard's settings reach `delayq serve`: written always, false by default, so a
    pod never falls back to serve's own default (which allows private targets)."""
    hook = {"url": "http://receiver.shop.svc/h"}
    default = topic_json(spec_of(topicType="webhook", delivery={"webhook": hook}))
    assert default["webhook_allow_private_targets"] is False
    assert default["webhook_allowed_cidrs"] == ""
    allowing = spec_of(
        topicType="webhook",
        delivery={
            "webhook": {
                **hook,
                "allowPrivateTargets": True,
                "allowedCidrs": ["10.96.0.0/12", "fd00::/8"],
            }
        },
    )
    written = topic_json(allowing)
    assert written["webhook_allow_private_targets"] is True
    assert written["webhook_allowed_cidrs"] == "10.96.0.0/12,fd00::/8"
    settings = TopicFile.from_json(json.dumps(written)).service_settings({})
    assert settings["webhook_allow_private_targets"] is True
    assert settings["webhook_allowed_cidrs"] == "10.96.0.0/12,fd00::/8"


@pytest.mark.parametrize(
    ("webhook", "message"),
    [
        ({"allowedCidrs": ["10.0.0.0/8", "10.0.0.0/33"]}, r"allowedCidrs\[1\]: '10.0.0.0/33'"),
        ({"allowedCidrs": ["office-lan"]}, r"allowedCidrs\[0\]: 'office-lan' is not a CIDR"),
        ({"allowedCidrs": ["10.0.0.1"]}, r"allowedCidrs\[0\]: '10.0.0.1' is not a CIDR"),
        ({"allowedCidrs": [8]}, r"allowedCidrs\[0\] must be a string"),
        ({"allowedCidrs": "10.0.0.0/8"}, r"allowedCidrs must be a list"),
        ({"allowPrivateTargets": "yes"}, r"allowPrivateTargets must be true or false"),
    ],
)
def test_bad_webhook_target_settings_name_the_field(webhook: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=rf"delivery\.webhook\.{message}"):
        spec_of(topicType="webhook", delivery={"webhook": {"url": "http://x/h", **webhook}})


def test_worker_settings_change_the_config_hash_and_so_roll_the_pods() -> None:
    base = spec_of()
    hash_of = lambda spec: by_kind_name(rendered(spec))["StatefulSet", "orders-service"]["spec"][  # noqa: E731
        "template"
    ]["metadata"]["annotations"][naming.CONFIG_HASH_ANNOTATION]
    assert hash_of(base) == config_hash(base, CTX, 16)
    assert hash_of(spec_of(worker={"concurrency": 64})) != hash_of(base)
    assert hash_of(spec_of(worker={"resources": {"limits": {"cpu": "1"}}})) != hash_of(base)
    assert hash_of(spec_of()) == hash_of(base)  # deterministic


def test_secret_holds_every_credential_base64() -> None:
    secret = by_kind_name(rendered())["Secret", "orders-credentials"]
    assert secret["data"] == {
        naming.SECRET_REDIS_PASSWORD: "cHc=",
        naming.SECRET_API_TOKEN: "dG9r",
        naming.SECRET_ZOOKEEPER_PASSWORD: "ems=",
        naming.SECRET_REDIS_ADMIN_PASSWORD: "YWRtaW4=",
    }


def test_network_policy_admits_only_service_pods_redis_peers_and_operator() -> None:
    policy = by_kind_name(rendered())["NetworkPolicy", "orders-redis"]["spec"]
    assert policy["podSelector"]["matchLabels"] == naming.redis_selector("orders")
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    peers = rule["from"]
    assert peers[0] == {"podSelector": {"matchLabels": naming.service_selector("orders")}}
    assert peers[1] == {"podSelector": {"matchLabels": naming.redis_selector("orders")}}
    assert peers[2]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ops"}
    assert peers[2]["podSelector"]["matchLabels"] == naming.OPERATOR_POD_LABELS


def test_disruption_budgets_allow_one_pod_at_a_time() -> None:
    for manifest in rendered():
        if manifest["kind"] == "PodDisruptionBudget":
            assert manifest["spec"]["maxUnavailable"] == 1


def test_build_all_is_pure_and_unowned() -> None:
    spec = spec_of()
    first = build_all(spec, CTX, CREDS, 16, False)
    assert first == build_all(spec, CTX, CREDS, 16, False)
    assert all("ownerReferences" not in m["metadata"] for m in first)
