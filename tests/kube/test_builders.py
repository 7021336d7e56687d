"""Every manifest the operator renders: names, labels, owner refs, probes, security, policy."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from typing import Any

import pytest

from delayq.kube import naming
from delayq.kube.apply import contains, update_patch
from delayq.kube.builders.bundle import build_all, render
from delayq.kube.builders.common import BuildContext, Credentials
from delayq.kube.builders.redis import (
    REDIS_PRESTOP_SCRIPT,
    REDIS_START_SCRIPT,
    SWITCHOVER_WAIT_S,
    master_endpoint_slice,
    redis_maxmemory,
)
from delayq.kube.builders.service import NON_PUBLIC_IPV4, NON_PUBLIC_IPV6, config_hash
from delayq.kube.ensembles import EnsembleRefused
from delayq.kube.pod_tracing import PodTracing
from delayq.kube.quantity import memory_bytes, parse_quantity
from delayq.kube.spec import (
    ALLOW_FROM_EMPTY_PEER_MESSAGE,
    ALLOW_FROM_IP_BLOCK_ALONE_MESSAGE,
    STREAM_KEY_ENGINE_MESSAGE,
    WEBHOOK_HTTPS_MESSAGE,
    SpecError,
    TopicSpec,
    parse_spec,
)
from delayq.service.config import ConfigError, ServiceConfig, env_name
from delayq.service.delivery.targets import TargetPolicy
from delayq.service.topic_file import TopicFile
from tests.kube.test_crd_schema import crd

CTX = BuildContext(image="delayq:test", redis_image="redis:test", operator_namespace="ops")
CREDS = Credentials(
    redis_password="pw",
    api_token="tok",
    zookeeper_password="zk",
    redis_admin_password="admin",
    read_token="viewer",
    metrics_token="scraper",
    lease_token_key="leasekey",
    operator_metrics_token="operator-scraper",
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
        ("NetworkPolicy", "orders-service"),
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
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    # the token the pods require on /metrics, from the Secret in the monitor's namespace
    assert endpoint["bearerTokenSecret"] == {"name": "orders-credentials", "key": "metrics-token"}
    secret = by_kind_name(rendered())["Secret", "orders-credentials"]
    assert monitor["metadata"]["namespace"] == secret["metadata"]["namespace"]
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


def test_service_statefulset_one_pod_per_broker_with_affinity_and_spread() -> None:
    sts = by_kind_name(rendered(spec_of(brokers=4, slotAmount=16)))["StatefulSet", "orders-service"]
    assert sts["spec"]["replicas"] == 4
    affinity = sts["spec"]["template"]["spec"]["affinity"]
    assert "podAffinity" not in affinity  # broker pairs: on the Redis side (redis_affinity)
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
        topicType="webhook",
        delivery={"webhook": {"url": "https://x.example/h"}},
        maxRetries=3,
        limits={"maxPending": 1000},
    )
    config = json.loads(
        by_kind_name(rendered(spec))["ConfigMap", "orders-config"]["data"]["topic.json"]
    )
    assert config["topic"] == "orders"
    assert config["namespace"] == "shop"
    assert config["slot_amount"] == 16
    assert config["max_retries"] == 3
    assert config["limits_max_pending"] == 1000  # the quota the schedule script enforces
    assert topic_json(spec_of())["limits_max_pending"] == 0  # none by default
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
    hook = {"url": "https://receiver.shop.svc/h"}
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


def test_an_external_stream_target_is_guarded_unless_the_topic_allows_it() -> None:
    """The stream guard's settings reach `delayq serve` the same way: always written."""
    ref = {"name": "target", "key": "url"}
    default = topic_json(spec_of(topicType="stream", delivery={"stream": {"urlSecretRef": ref}}))
    assert default["stream_allow_private_targets"] is False
    assert default["stream_allowed_cidrs"] == ""
    stream = {"urlSecretRef": ref, "allowedCidrs": ["10.96.0.0/12"]}
    written = topic_json(spec_of(topicType="stream", delivery={"stream": stream}))
    settings = TopicFile.from_json(json.dumps(written)).service_settings({})
    assert settings["stream_allow_private_targets"] is False
    assert settings["stream_allowed_cidrs"] == "10.96.0.0/12"


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
        spec_of(topicType="webhook", delivery={"webhook": {"url": "https://x/h", **webhook}})


def test_http_webhooks_need_allow_insecure_http_which_reaches_serve() -> None:
    """https only by default (the CRD's rule, repeated by the parser); allowInsecureHttp is
    written into topic.json always, so a pod never falls back to serve's hand-run true."""
    hook = {"url": "http://receiver.shop.svc/h"}
    shown = "http://receiver.shop.svc/…"  # no path: it may be the receiver's secret
    with pytest.raises(SpecError, match=re.escape(f"{WEBHOOK_HTTPS_MESSAGE} (url={shown})")):
        spec_of(topicType="webhook", delivery={"webhook": hook})
    assert (
        topic_json(spec_of(topicType="webhook", delivery={"webhook": WEBHOOK}))[
            "webhook_allow_insecure_http"
        ]
        is False
    )
    allowed = spec_of(
        topicType="webhook", delivery={"webhook": {**hook, "allowInsecureHttp": True}}
    )
    written = topic_json(allowed)
    assert written["webhook_allow_insecure_http"] is True
    settings = TopicFile.from_json(json.dumps(written)).service_settings({})
    assert ServiceConfig(**settings).webhook_url == hook["url"]
    refused = {**written, "webhook_allow_insecure_http": False}
    with pytest.raises(ConfigError, match="must start with https://"):
        ServiceConfig(**TopicFile.from_json(json.dumps(refused)).service_settings({}))


def webhook_env(spec: TopicSpec) -> dict[str, Any]:
    sts = by_kind_name(rendered(spec))["StatefulSet", "orders-service"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return {
        entry["name"]: entry["valueFrom"]["secretKeyRef"]
        for entry in container["env"]
        if entry["name"].startswith("DELAYQ_WEBHOOK_")
    }


def test_signing_secret_and_extra_headers_come_from_the_tenants_secrets() -> None:
    """Each reference becomes the variable `delayq serve` reads, from the tenant's Secret in the
    topic's namespace; required (not optional): a topic that asks to sign never sends unsigned."""
    assert webhook_env(spec_of(topicType="webhook", delivery={"webhook": WEBHOOK})) == {}
    spec = spec_of(
        topicType="webhook",
        delivery={
            "webhook": {
                **WEBHOOK,
                "signingSecretRef": {"name": "hooks-signing", "key": "secrets"},
                "extraHeadersSecretRef": {"name": "hooks.auth", "key": "headers.txt"},
            }
        },
    )
    assert webhook_env(spec) == {
        env_name("webhook_secret"): {"name": "hooks-signing", "key": "secrets"},
        env_name("webhook_extra_headers"): {"name": "hooks.auth", "key": "headers.txt"},
    }
    assert env_name("webhook_secret") == "DELAYQ_WEBHOOK_SECRET"  # what docs/operator.md says


def test_a_webhook_url_from_a_secret_reaches_the_pods_env_and_no_configmap() -> None:
    """urlSecretRef: the URL (a credential in it) is the pods' DELAYQ_WEBHOOK_URL from the
    tenant's Secret; topic.json says nothing of it, and serve takes the variable over the file."""
    ref = {"name": "hooks", "key": "url"}
    spec = spec_of(topicType="webhook", delivery={"webhook": {"urlSecretRef": ref}})
    assert webhook_env(spec) == {"DELAYQ_WEBHOOK_URL": ref}
    written = topic_json(spec)
    assert written["webhook_url"] == ""
    url = "https://shop:hunter2@hooks.example.com/h?token=x"
    base = TopicFile.from_json(json.dumps(written)).service_settings({})
    config = ServiceConfig.from_env({"DELAYQ_WEBHOOK_URL": url}, base=base)
    assert config.webhook_url == url


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ({"key": "k"}, r"signingSecretRef\.name is required"),
        ({"name": "s"}, r"signingSecretRef\.key is required"),
        ({"name": "Hooks", "key": "k"}, r"signingSecretRef\.name: a Secret name must be a DNS"),
        ({"name": "s", "key": "a/b"}, r"signingSecretRef\.key: a Secret key must consist of"),
        ({"name": "s" * 254, "key": "k"}, r"signingSecretRef\.name: a Secret name"),
        ("hooks-signing", r"signingSecretRef must be an object"),
    ],
)
def test_bad_secret_references_name_the_field(ref: Any, message: str) -> None:
    with pytest.raises(SpecError, match=rf"delivery\.webhook\.{message}"):
        spec_of(topicType="webhook", delivery={"webhook": {**WEBHOOK, "signingSecretRef": ref}})


def test_worker_settings_change_the_config_hash_and_so_roll_the_pods() -> None:
    base = spec_of()
    hash_of = lambda spec: by_kind_name(rendered(spec))["StatefulSet", "orders-service"]["spec"][  # noqa: E731
        "template"
    ]["metadata"]["annotations"][naming.CONFIG_HASH_ANNOTATION]
    assert hash_of(base) == config_hash(base, CTX, 16)
    assert hash_of(spec_of(worker={"concurrency": 64})) != hash_of(base)
    assert hash_of(spec_of(worker={"resources": {"limits": {"cpu": "1"}}})) != hash_of(base)
    assert hash_of(spec_of()) == hash_of(base)  # deterministic


def test_the_engines_live_settings_roll_no_pod_and_the_others_do() -> None:
    """maxRetries, retention, quota, expiry reach every client through the settings record the
    health pass publishes (tests/kube/test_settings_record.py): a change must not restart the
    service pods; a setting only `delayq serve` reads at start must."""
    base = config_hash(spec_of(), CTX, 16)
    live = {
        "maxRetries": 3,
        "outcomeRetention": "1h",
        "limits": {"maxPending": 1000},
        "expiry": {"ttl": "1h", "action": "drop"},
        "retry": {"for": "1h", "exhaustedAction": "drop"},
        "journalMaxLen": 100,
        "delivery": {"rateLimit": {"perSecond": 250.5, "burst": 40}},
    }
    assert config_hash(spec_of(**live), CTX, 16) == base
    assert config_hash(spec_of(ackTimeout="45s"), CTX, 16) != base


def test_secret_holds_every_credential_base64() -> None:
    secret = by_kind_name(rendered())["Secret", "orders-credentials"]
    assert secret["data"] == {
        naming.SECRET_REDIS_PASSWORD: "cHc=",
        naming.SECRET_API_TOKEN: "dG9r",
        naming.SECRET_ZOOKEEPER_PASSWORD: "ems=",
        naming.SECRET_REDIS_ADMIN_PASSWORD: "YWRtaW4=",
        naming.SECRET_READ_TOKEN: "dmlld2Vy",
        naming.SECRET_METRICS_TOKEN: "c2NyYXBlcg==",
        naming.SECRET_LEASE_TOKEN_KEY: "bGVhc2VrZXk=",
        naming.SECRET_OPERATOR_METRICS_TOKEN: "b3BlcmF0b3Itc2NyYXBlcg==",
    }


def test_service_pods_require_the_metrics_token_and_take_the_optional_rotation_token() -> None:
    """metrics-token is generated like the API token and required: /metrics is closed on
    Kubernetes. api-token-previous is a key the tenant may add (the operator never writes it):
    optional, so a pod starts without it."""
    sts = by_kind_name(rendered())["StatefulSet", "orders-service"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    refs = {
        entry["name"]: entry["valueFrom"]["secretKeyRef"]
        for entry in container["env"]
        if "secretKeyRef" in entry.get("valueFrom", {})
    }
    assert refs[env_name("api_token_previous")] == {
        "name": "orders-credentials",
        "key": "api-token-previous",
        "optional": True,
    }
    assert refs[env_name("metrics_token")] == {"name": "orders-credentials", "key": "metrics-token"}
    assert refs[env_name("operator_metrics_token")] == {
        "name": "orders-credentials",
        "key": "operator-metrics-token",
    }
    assert refs[env_name("api_token")] == {"name": "orders-credentials", "key": "api-token"}
    secret = by_kind_name(rendered())["Secret", "orders-credentials"]
    assert "api-token-previous" not in secret["data"]
    assert secret["data"]["metrics-token"] == "c2NyYXBlcg=="  # "scraper"


def test_every_service_pod_takes_the_topics_lease_token_key() -> None:
    """One key for the topic, from its Secret (required): a lease token issued by one pod is
    accepted by every other, and serve reads it from the variable its setting names."""
    sts = by_kind_name(rendered())["StatefulSet", "orders-service"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    refs = {
        entry["name"]: entry["valueFrom"]["secretKeyRef"]
        for entry in container["env"]
        if "secretKeyRef" in entry.get("valueFrom", {})
    }
    assert env_name("lease_token_key") == "DELAYQ_LEASE_TOKEN_KEY"
    key = {"name": "orders-credentials", "key": "lease-token-key"}
    assert refs["DELAYQ_LEASE_TOKEN_KEY"] == key


def test_service_pods_wait_for_their_brokers_rather_than_restart() -> None:
    """The operator's pods wait for a broker or ZooKeeper down at start, alive and unready
    (service/starting.py), and serve reads the variable its setting names."""
    sts = by_kind_name(rendered())["StatefulSet", "orders-service"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    values = {entry["name"]: entry.get("value") for entry in container["env"]}
    assert values[env_name("wait_for_brokers")] == "true"
    env = {"DELAYQ_TOPIC": "t", env_name("wait_for_brokers"): "true"}
    assert ServiceConfig.from_env(env).wait_for_brokers


def test_service_pods_take_the_read_token_the_operator_generates() -> None:
    """The read-only token is the Secret's own key (generated, not optional): every pod
    serves the dashboard to its holder, and serve reads it from the variable it documents."""
    sts = by_kind_name(rendered())["StatefulSet", "orders-service"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    (entry,) = [e for e in container["env"] if e["name"] == env_name("read_token")]
    assert entry["valueFrom"]["secretKeyRef"] == {"name": "orders-credentials", "key": "read-token"}


def test_network_policy_admits_only_service_pods_redis_peers_backups_and_operator() -> None:
    policy = by_kind_name(rendered())["NetworkPolicy", "orders-redis"]["spec"]
    assert policy["podSelector"]["matchLabels"] == naming.redis_selector("orders")
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    peers = rule["from"]
    assert peers[0] == {"podSelector": {"matchLabels": naming.service_selector("orders")}}
    assert peers[1] == {"podSelector": {"matchLabels": naming.redis_selector("orders")}}
    assert peers[2] == {"podSelector": {"matchLabels": naming.backup_selector("orders")}}
    assert peers[3]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ops"}
    assert peers[3]["podSelector"]["matchLabels"] == naming.OPERATOR_POD_LABELS
    assert len(peers) == 4


WEBHOOK = {"url": "https://hooks.example/h"}
PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def service_policy(spec: TopicSpec) -> dict[str, Any]:
    policy: dict[str, Any] = by_kind_name(rendered(spec))["NetworkPolicy", "orders-service"]
    return policy


def test_service_network_policy_selects_the_service_pods_both_ways() -> None:
    items = by_kind_name(rendered())
    policy = items["NetworkPolicy", "orders-service"]["spec"]
    template = items["StatefulSet", "orders-service"]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= template.items()
    assert policy["podSelector"]["matchLabels"] == naming.service_selector("orders")
    assert policy["policyTypes"] == ["Ingress", "Egress"]


def test_service_api_admits_the_namespace_the_operator_and_allow_from_peers() -> None:
    (rule,) = service_policy(spec_of())["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": naming.SERVICE_HTTP_PORT}]
    namespace, operator = rule["from"]
    assert namespace == {"podSelector": {}}  # no namespaceSelector: the policy's namespace
    assert operator["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ops"}
    assert operator["podSelector"]["matchLabels"] == naming.OPERATOR_POD_LABELS
    block = {"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.128/25"]}}
    spec = spec_of(networkPolicy={"allowFrom": [PROMETHEUS, block]})
    (rule,) = service_policy(spec)["spec"]["ingress"]
    assert rule["from"][2:] == [PROMETHEUS, block]
    assert rule["ports"] == [{"protocol": "TCP", "port": naming.SERVICE_HTTP_PORT}]


def test_allow_from_ip_blocks_reach_the_policy_normalized() -> None:
    """The API server rejects host bits in an ipBlock; the tenant's text is normalized."""
    block = {"ipBlock": {"cidr": "203.0.113.7/24", "except": ["203.0.113.200/25"]}}
    (rule,) = service_policy(spec_of(networkPolicy={"allowFrom": [block]}))["spec"]["ingress"]
    assert rule["from"][2:] == [
        {"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.128/25"]}}
    ]


def egress_of(spec: TopicSpec) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = service_policy(spec)["spec"]["egress"]
    return rules


@pytest.mark.parametrize("topic_type", ["pull", "stream"])
def test_service_egress_is_dns_its_redis_and_zookeeper_only(topic_type: str) -> None:
    items = by_kind_name(rendered(spec_of(topicType=topic_type)))
    dns, redis, zookeeper = egress_of(spec_of(topicType=topic_type))
    assert dns == {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    (peer,) = redis["to"]
    redis_pods = items["StatefulSet", "orders-redis-0"]["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= redis_pods.items()
    assert "namespaceSelector" not in peer  # the topic's own namespace only
    assert redis["ports"] == [{"protocol": "TCP", "port": naming.REDIS_PORT}]
    assert zookeeper == {"ports": [{"protocol": "TCP", "port": 2181}]}  # CTX's default


PLATFORM_ZK = "zk-0:2281,zk-1:2281,zk-2:2282/delayq"


@pytest.mark.parametrize("connect", ["zk-1:2281", "ZK-2:2282,zk-0:2281"])
def test_zookeeper_egress_and_connect_are_the_platforms_ensemble_a_topic_selects(
    connect: str,
) -> None:
    """The tenant's hosts select an allowed ensemble; its ports, hosts and chroot are used."""
    build = dataclasses.replace(CTX, zookeeper_allowed_ensembles=(PLATFORM_ZK,))
    spec = spec_of(zookeeper={"connect": connect})
    items = by_kind_name(render(OWNER, spec, build, CREDS, 8, False))
    zookeeper = items["NetworkPolicy", "orders-service"]["spec"]["egress"][2]
    assert zookeeper == {"ports": [{"protocol": "TCP", "port": p} for p in (2281, 2282)]}
    config = json.loads(items["ConfigMap", "orders-config"]["data"]["topic.json"])
    assert config["zookeeper_connect"] == PLATFORM_ZK


@pytest.mark.parametrize(
    "connect",
    [
        "169.254.169.254:80,zk-0:2281",  # a port of the metadata endpoint beside a real host
        "zk-0:2281,zookeeper.elsewhere:2281",  # two ensembles' hosts
        "zk-0:2182",  # a port of the platform's host the platform does not use
    ],
)
def test_a_connection_string_outside_the_platforms_ensembles_renders_nothing(
    connect: str,
) -> None:
    build = dataclasses.replace(CTX, zookeeper_allowed_ensembles=(PLATFORM_ZK,))
    with pytest.raises(EnsembleRefused, match=r"names a host of no ZooKeeper ensemble"):
        render(OWNER, spec_of(zookeeper={"connect": connect}), build, CREDS, 8, False)


def test_zookeeper_connect_ports_must_be_tcp_ports() -> None:
    with pytest.raises(SpecError, match=r"zookeeper\.connect port 99999 must be between 1 and"):
        spec_of(zookeeper={"connect": "zk:99999"})


def test_webhook_egress_reaches_public_addresses_only() -> None:
    *_, webhook = egress_of(spec_of(topicType="webhook", delivery={"webhook": WEBHOOK}))
    assert webhook["ports"] == [{"protocol": "TCP"}]
    v4, v6 = webhook["to"]
    assert v4 == {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(NON_PUBLIC_IPV4)}}
    assert v6 == {"ipBlock": {"cidr": "::/0", "except": list(NON_PUBLIC_IPV6)}}
    assert set(v4["ipBlock"]["except"]) == {
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "127.0.0.0/8",
        "100.64.0.0/10",
    }
    assert set(v6["ipBlock"]["except"]) == {"fc00::/7", "fe80::/10", "64:ff9b::/96"}


def test_the_excepted_ranges_are_ones_the_ssrf_guard_refuses() -> None:
    """The policy is the guard's second line: it must not except what the guard would allow
    (a public range), or the two would disagree about where a webhook may go."""
    guard = TargetPolicy()
    for cidr in NON_PUBLIC_IPV4 + NON_PUBLIC_IPV6:
        network = ipaddress.ip_network(cidr)
        for address in (network[1], network[-2]):
            assert guard.refusal(str(address)) is not None, address


def test_webhook_egress_follows_allow_private_targets_and_allowed_cidrs() -> None:
    hook = {**WEBHOOK, "allowPrivateTargets": True}
    *_, webhook = egress_of(spec_of(topicType="webhook", delivery={"webhook": hook}))
    assert webhook["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
    hook = {**WEBHOOK, "allowedCidrs": ["10.96.0.1/12", "fd00::/8"]}
    *_, webhook = egress_of(spec_of(topicType="webhook", delivery={"webhook": hook}))
    assert webhook["to"][0]["ipBlock"]["except"] == list(NON_PUBLIC_IPV4)
    assert webhook["to"][2:] == [
        {"ipBlock": {"cidr": "10.96.0.0/12"}},  # host bits cleared: a policy needs a network
        {"ipBlock": {"cidr": "fd00::/8"}},
    ]


def test_a_loosened_service_policy_is_still_patched() -> None:
    """apply.contains() ignores fields the existing object has beyond the desired ones, so
    dropping the `except` (allowPrivateTargets turned on) would look unchanged without the
    policy hash annotation, and the webhook would stay blocked."""
    closed = service_policy(spec_of(topicType="webhook", delivery={"webhook": WEBHOOK}))
    hook = {**WEBHOOK, "allowPrivateTargets": True}
    opened = service_policy(spec_of(topicType="webhook", delivery={"webhook": hook}))
    assert contains(closed["spec"], opened["spec"])  # what the hash is for
    assert not contains(closed, update_patch(opened))
    assert contains(closed, update_patch(closed))


@pytest.mark.parametrize(
    ("allow_from", "message"),
    [
        ("monitoring", r"networkPolicy\.allowFrom must be a list of at most 32"),
        ([{}] * 33, r"networkPolicy\.allowFrom must be a list of at most 32"),
        (["monitoring"], r"allowFrom\[0\] must be an object"),
        ([PROMETHEUS, {}], r"allowFrom\[1\]: " + re.escape(ALLOW_FROM_EMPTY_PEER_MESSAGE)),
        (
            [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}],
            r"allowFrom\[0\]: " + re.escape(ALLOW_FROM_IP_BLOCK_ALONE_MESSAGE),
        ),
        ([{"namespace": "monitoring"}], r"allowFrom\[0\]: unknown field 'namespace'"),
        ([{"podSelector": {"app": "x"}}], r"allowFrom\[0\]\.podSelector: unknown field 'app'"),
        (
            [{"podSelector": {"matchLabels": {"app": 1}}}],
            r"allowFrom\[0\]\.podSelector\.matchLabels must map label names to string",
        ),
        (
            [{"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}],
            r"allowFrom\[0\]\.namespaceSelector\.matchExpressions\[0\]\.operator 'Is'",
        ),
        (
            [{"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}],
            r"matchExpressions\[0\]\.values must be non-empty for In",
        ),
        ([{"ipBlock": {"cidr": "10.0.0.0/33"}}], r"allowFrom\[0\]\.ipBlock\.cidr: '10.0.0.0/33'"),
        (
            [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["192.168.0.0/16"]}}],
            r"allowFrom\[0\]\.ipBlock\.except\[0\] '192.168.0.0/16' must lie strictly inside",
        ),
        (
            [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["fd00::/8"]}}],
            r"allowFrom\[0\]\.ipBlock\.except\[0\] 'fd00::/8' must lie strictly inside",
        ),
    ],
)
def test_bad_allow_from_entries_are_named(allow_from: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        spec_of(networkPolicy={"allowFrom": allow_from})


def test_allow_from_selectors_are_kept_as_written() -> None:
    every_namespace: dict[str, Any] = {"namespaceSelector": {}}
    expression = {
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "team", "operator": "In", "values": ["ops"]},
                {"key": "legacy", "operator": "DoesNotExist"},
            ]
        }
    }
    spec = spec_of(networkPolicy={"allowFrom": [every_namespace, expression]})
    assert spec.network_policy_allow_from == (every_namespace, expression)


def test_disruption_budgets_allow_one_pod_at_a_time() -> None:
    for manifest in rendered():
        if manifest["kind"] == "PodDisruptionBudget":
            assert manifest["spec"]["maxUnavailable"] == 1


def test_build_all_is_pure_and_unowned() -> None:
    spec = spec_of()
    first = build_all(spec, CTX, CREDS, 16, False)
    assert first == build_all(spec, CTX, CREDS, 16, False)
    assert all("ownerReferences" not in m["metadata"] for m in first)


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


@pytest.mark.parametrize(
    ("fields", "waits_s"),
    [
        # a pull topic: the engine's 10 s handoff drain, the 20 s grace, 10 s for ZooKeeper
        ({}, 10 + 20 + 10),
        # a webhook POST may take its whole timeout, and its ack follows it
        (
            {
                "topicType": "webhook",
                "ackTimeout": "2m",
                "delivery": {"webhook": {"url": "https://x.example/h", "timeout": "60s"}},
            },
            60 + 2 + 20 + 10,
        ),
    ],
)
def test_a_service_pod_is_not_killed_before_its_stop_can_end(
    fields: dict[str, Any], waits_s: int
) -> None:
    """SIGKILL in the middle of a handoff redelivers every message whose POST was in flight:
    the pod's grace period covers every wait of the service's stop (a fixed 30 s did not)."""
    sts = by_kind_name(rendered(spec_of(**fields)))["StatefulSet", "orders-service"]
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > waits_s


COLLECTOR = "http://otel-collector.observability.svc:4318"
TRACED = dataclasses.replace(
    CTX, tracing=PodTracing(otlp_endpoint=COLLECTOR, headers_secret="otel-ingest")
)


def otel_env(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    sts = by_kind_name(manifests)["StatefulSet", "orders-service"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    env = container["env"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in env if "OTEL" in e["name"]}


def egress_ports(manifests: list[dict[str, Any]]) -> set[int]:
    policy = by_kind_name(manifests)["NetworkPolicy", "orders-service"]
    return {p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"] if "port" in p}


def test_a_topic_may_opt_out_of_the_platforms_traces_and_never_choose_where_they_go() -> None:
    """spec.tracing is hostile input: the platform's endpoint, headers Secret and port are
    what the pods get whatever the topic writes beside `enabled` (the API server prunes
    unknown fields: the CRD has `enabled` only), and `enabled` is a boolean or a refusal."""
    hostile = spec_of(
        tracing={
            "enabled": True,
            "otlpEndpoint": "http://169.254.169.254:80",
            "endpoint": "http://collector.attacker.example:4318",
            "headersSecret": {"name": "someone-elses", "key": "headers"},
        }
    )
    manifests = render(OWNER, hostile, TRACED, CREDS, 16, False)
    text = json.dumps(manifests)
    for planted in ("169.254.169.254", "attacker", "someone-elses"):
        assert planted not in text
    env = otel_env(manifests)
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == COLLECTOR
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["secretKeyRef"]["name"] == "otel-ingest"
    assert 4318 in egress_ports(manifests)
    assert 80 not in egress_ports(manifests)
    assert render(OWNER, spec_of(), TRACED, CREDS, 16, False) == manifests  # = the default

    opted_out = render(OWNER, spec_of(tracing={"enabled": False}), TRACED, CREDS, 16, False)
    assert otel_env(opted_out) == {}
    assert 4318 not in egress_ports(opted_out)
    assert otel_env(rendered()) == {}  # the platform traces nothing: nothing to opt out of
    with pytest.raises(SpecError, match=r"tracing\.enabled must be true or false"):
        spec_of(tracing={"enabled": "http://collector.attacker.example:4318"})
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    tracing = schema["properties"]["spec"]["properties"]["tracing"]
    assert set(tracing["properties"]) == {"enabled"}
    assert "x-kubernetes-preserve-unknown-fields" not in json.dumps(tracing)


@pytest.mark.parametrize(
    ("endpoint", "port"),
    [(COLLECTOR, 4318), ("https://otlp.example.com", 443), ("http://otel/otlp", 80)],
)
def test_the_collectors_port_is_the_endpoints(endpoint: str, port: int) -> None:
    assert PodTracing(otlp_endpoint=endpoint).port == port


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DELAYQ_TRACING_OTLP_ENDPOINT", "otel-collector:4317"),
        ("DELAYQ_TRACING_OTLP_ENDPOINT", "http://user:pw@otel:4318"),
        ("DELAYQ_TRACING_OTLP_ENDPOINT", "http://otel:99999"),
        ("DELAYQ_TRACING_OTLP_ENDPOINT", "http://otel:4318/?token=x"),
        ("DELAYQ_TRACING_SAMPLER", "sometimes"),
        ("DELAYQ_TRACING_SAMPLER_ARG", "0.5"),  # no ratio sampler named
        ("DELAYQ_TRACING_HEADERS_SECRET", "Not_A_Name"),
    ],
)
def test_the_operator_refuses_tracing_values_it_cannot_forward(variable: str, value: str) -> None:
    env = {"DELAYQ_TRACING_OTLP_ENDPOINT": COLLECTOR, variable: value}
    with pytest.raises(ValueError, match=variable):
        PodTracing.from_env(env)
