"""The service pods' manifests: one pod per broker, the topic contract in their ConfigMap,
webhook targets and their guards, secrets and tokens in their env, what rolls them (the config
hash), and traces."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from delayq.kube import naming
from delayq.kube.builders.bundle import render
from delayq.kube.builders.service import config_hash
from delayq.kube.pod_tracing import PodTracing
from delayq.kube.spec import WEBHOOK_HTTPS_MESSAGE, SpecError, TopicSpec
from delayq.service.config import ConfigError, ServiceConfig, env_name
from delayq.service.topic_file import TopicFile
from tests.kube.manifests import CREDS, CTX, OWNER, WEBHOOK, by_kind_name, rendered, spec_of
from tests.kube.test_crd_schema import crd


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


def secret_refs(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """The service container's variables that come from a Secret: name -> its secretKeyRef."""
    sts = by_kind_name(manifests)["StatefulSet", "orders-service"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return {
        entry["name"]: entry["valueFrom"]["secretKeyRef"]
        for entry in container["env"]
        if "secretKeyRef" in entry.get("valueFrom", {})
    }


def test_service_pods_require_the_metrics_token_and_take_the_optional_rotation_token() -> None:
    """metrics-token is generated like the API token and required: /metrics is closed on
    Kubernetes. api-token-previous is a key the tenant may add (the operator never writes it):
    optional, so a pod starts without it."""
    refs = secret_refs(rendered())
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
    refs = secret_refs(rendered())
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
