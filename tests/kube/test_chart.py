"""The Helm chart: lint, render with several value sets, and check what it renders.

helm is built into a per-user cache by scripts/install-helm.sh when missing (never skipped).
Server-side validation of the rendered objects (and the CRD's CEL rules) is the e2e suite's job.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import pytest
import yaml

from delayq.kube import naming
from delayq.kube.builders.bundle import build_all
from delayq.kube.builders.common import PodPlacement
from delayq.kube.config import OperatorConfig, zookeeper_tls_from_env
from delayq.kube.pod_tracing import PodTracing
from delayq.kube.spec import TopicSpec
from delayq.kube.tenant_policy import TenantPolicy
from delayq.kube.zookeeper_clients import POLICY_ENV
from delayq.queue.topic import TopicType
from delayq.service.delivery.targets import parse_cidrs
from delayq.service.tracing import Tracing, wanted
from tests.kube.chart_support import (
    CHART,
    CLUSTER_SCOPED,
    CREDENTIALS,
    ROOT,
    VALUE_SETS,
    of_kind,
    operator_env,
    render,
    run_helm,
)
from tests.kube.test_crd_schema import EXAMPLES, to_jsonschema


def test_helm_lint_passes() -> None:
    result = run_helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_rendered_object_is_well_formed(value_set: str) -> None:
    docs = render(value_set)
    assert docs
    for doc in docs:
        assert isinstance(doc.get("apiVersion"), str)
        assert isinstance(doc.get("kind"), str)
        assert doc["metadata"]["name"]
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace"), f"{doc['kind']} without a namespace"


def test_values_schema_rejects_bad_values() -> None:
    for bad in (
        ["--set", "operator.replicas=0"],
        ["--set", "zookeeper.enabled=false"],  # then an address is required
        ["--set", "zookeeper.replicas=2"],  # no quorum
        ["--set", "operator.unknownKey=1"],
        ["--set", "operator.metrics.port=8080"],  # the liveness probe's port
        ["--set", "operator.metrics.serviceMonitor.interval=often"],
        ["--set", "operator.logFormat=xml"],
        ["--set", "topics.serviceMonitor.labels.release=1"],  # labels are strings
        ["--set", "zookeeper.tls.enabled=true"],  # the bundled ZooKeeper has no TLS port
        [
            "--set",
            "zookeeper.enabled=false",
            "--set",
            "zookeeper.address=zk:2281",
            "--set",
            "zookeeper.tls.enabled=true",
            "--set",
            "zookeeper.tls.caSecret=a",
            "--set",
            "zookeeper.tls.caConfigMap=b",  # one source of the CA, not two
        ],
        [  # TLS checked against the system CAs: any public certificate would pass
            "--set",
            "zookeeper.enabled=false",
            "--set",
            "zookeeper.address=zk:2281",
            "--set",
            "zookeeper.tls.enabled=true",
        ],
        ["--set-json", 'zookeeper.allowedEnsembles=["zk:2181 /x"]'],
        ["--set", "tenantPolicy.allowPrivateTargets=yes"],
        ["--set", "topics.tracing.otlpEndpoint=otel-collector:4317"],  # OTLP/HTTP: a URL
        ["--set", "topics.tracing.otlpEndpoint=http://user:pw@otel:4318"],  # in headers instead
        ["--set", "topics.tracing.sampler=sometimes"],
        ["--set-string", "topics.tracing.samplerArg=2"],
        ["--set", "topics.tracing.headersSecret.name=Not_A_Name"],
        ["--set", "tenantPolicy.allowedCidrs={office-lan}"],
    ):
        result = run_helm("template", "rel", str(CHART), *bad)
        assert result.returncode != 0, bad


def test_chart_crds_are_the_repository_crds() -> None:
    for source in (ROOT / "crds").glob("*.yaml"):
        assert (CHART / "crds" / source.name).read_bytes() == source.read_bytes(), source.name
    rendered = {
        doc["metadata"]["name"]
        for doc in of_kind(render("defaults", True), "CustomResourceDefinition")
    }
    assert rendered == {"delaytopics.delayq.io"}  # no kopf peering: a Lease elects the leader


def test_rendered_crd_schema_validates_the_examples() -> None:
    import jsonschema

    (crd,) = [
        doc
        for doc in of_kind(render("defaults", True), "CustomResourceDefinition")
        if doc["metadata"]["name"] == "delaytopics.delayq.io"
    ]
    schema = to_jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    validator = jsonschema.Draft7Validator(schema)
    for path in (EXAMPLES / "valid").glob("*.yaml"):
        assert list(validator.iter_errors(yaml.safe_load(path.read_text()))) == [], path.name


def test_operator_deployment_is_hardened_and_matches_the_network_policy() -> None:
    (deployment,) = of_kind(render("defaults"), "Deployment")
    pod = deployment["spec"]["template"]
    assert naming.OPERATOR_POD_LABELS.items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["spec"]["containers"]
    assert container["args"] == ["operator", "--json-logs"]  # like the delay-service pods
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert deployment["spec"]["replicas"] == 2
    downward = {
        item["name"]: item["valueFrom"]["fieldRef"]["fieldPath"]
        for item in container["env"]
        if "fieldRef" in item.get("valueFrom", {})
    }
    # The Lease lives in the operator's namespace; its holder is named after the pod.
    assert downward == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}



def test_operator_env_is_what_the_operator_reads() -> None:
    config = OperatorConfig.from_env(operator_env("defaults"))
    assert config.clusterwide
    assert not config.standalone  # every replica campaigns for the Lease, even a single one
    assert config.leader_lease_name == "delayq-operator"
    assert config.build.default_zookeeper == "rel-delayq-zookeeper.delayq-system.svc:2181"
    assert config.build.operator_namespace == "delayq-system"
    external = OperatorConfig.from_env(operator_env("single-replica-external-zk"))
    assert not external.standalone
    assert external.build.default_zookeeper == "zk-0.zk:2181,zk-1.zk:2181/delayq"
    namespaced = OperatorConfig.from_env(operator_env("namespaced"))
    assert namespaced.namespaces == ("shop", "billing")


def _flat(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def test_the_charts_defaults_are_the_operators_own() -> None:
    """values.yaml and kube/config.py both default the operator (lease name, failover grace,
    health interval, images, ServiceMonitor, endpoints, ...): rendered with its defaults, the
    chart configures exactly what the operator does with no variable set, but for the names
    derived from the release."""
    from_chart = _flat(dataclasses.asdict(OperatorConfig.from_env(operator_env("defaults"))))
    own = _flat(dataclasses.asdict(OperatorConfig.from_env({"POD_NAMESPACE": "delayq-system"})))
    differ = {name for name in own if from_chart[name] != own[name]}
    assert differ == {"build.default_zookeeper", "zookeeper_clients_policy"}  # rel-delayq-...


def test_the_tenant_policy_reaches_the_operator() -> None:
    """Closed by default: no topic may opt out of the SSRF guard; the values open it."""
    assert OperatorConfig.from_env(operator_env("defaults")).tenant_policy == TenantPolicy()
    configured = OperatorConfig.from_env(operator_env("tenant-policy")).tenant_policy
    assert configured == TenantPolicy(True, parse_cidrs(["10.96.0.0/12", "fd00::/8"]))


def test_the_allowed_ensembles_reach_the_operator() -> None:
    """The operator's own ensemble only by default; the values add more."""
    default = "rel-delayq-zookeeper.delayq-system.svc:2181"
    config = OperatorConfig.from_env(operator_env("defaults"))
    assert config.build.zookeeper_ensembles == (default,)
    allowed = OperatorConfig.from_env(operator_env("zookeeper-allowed-ensembles"))
    assert allowed.build.zookeeper_ensembles == (
        default,
        "zk-a-0.zk-a:2181,zk-a-1.zk-a:2181/delayq",
        "zk-b:2281",
    )


def test_zookeeper_tls_without_a_ca_needs_verification_off_explicitly() -> None:
    unverified = [
        *VALUE_SETS["zookeeper-tls"][:6],  # enabled, no CA
        "--set",
        "zookeeper.tls.verifyCerts=false",
    ]
    assert "caConfigMap" not in " ".join(unverified)
    result = run_helm("template", "rel", str(CHART), *unverified)
    assert result.returncode == 0, result.stderr


def test_zookeeper_tls_mounts_what_the_operators_variables_name() -> None:
    """Each TLS file the operator is told of lies in a volume holding that key of the right
    Secret or ConfigMap; without TLS there is neither variable nor volume."""
    assert zookeeper_tls_from_env(operator_env("defaults")) is None
    (deployment,) = of_kind(render("zookeeper-tls"), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    tls = zookeeper_tls_from_env(operator_env("zookeeper-tls"))
    assert tls is not None
    assert tls.verify_certs
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    expected = {
        tls.ca_file: ("configMap", "zk-ca", "bundle.pem"),
        tls.cert_file: ("secret", "zk-client", "tls.crt"),
        tls.key_file: ("secret", "zk-client", "tls.key"),
    }
    for path, (kind, source, key) in expected.items():
        directory, name = path.rsplit("/", 1)
        volume = volumes[mounts[directory]]
        assert volume[kind].get("name", volume[kind].get("secretName")) == source
        assert {"key": key, "path": name} in volume[kind]["items"]
    (plain,) = of_kind(render("defaults"), "Deployment")
    assert [v["name"] for v in plain["spec"]["template"]["spec"]["volumes"]] == ["tmp"]




def test_zookeeper_is_optional_and_hardened() -> None:
    assert of_kind(render("single-replica-external-zk"), "StatefulSet") == []
    (zookeeper,) = of_kind(render("zookeeper-ensemble"), "StatefulSet")
    assert zookeeper["spec"]["replicas"] == 3
    (container,) = zookeeper["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    servers = next(e["value"] for e in container["env"] if e["name"] == "ZOO_SERVERS").split()
    assert len(servers) == 3
    services = {s["metadata"]["name"] for s in of_kind(render("defaults"), "Service")}
    zookeeper_services = {"rel-delayq-zookeeper", "rel-delayq-zookeeper-headless"}
    assert services == {*zookeeper_services, "rel-delayq-operator-metrics"}


def admin_password_ref(value_set: str) -> dict[str, str] | None:
    (deployment,) = of_kind(render(value_set), "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    refs = [
        e["valueFrom"]["secretKeyRef"]
        for e in env
        if e["name"] == "DELAYQ_ZOOKEEPER_ADMIN_PASSWORD"
    ]
    return refs[0] if refs else None


def test_the_operator_gets_its_zookeeper_admin_password_from_a_kept_secret() -> None:
    ref = admin_password_ref("defaults")
    assert ref == {"name": "rel-delayq-zookeeper-admin", "key": "admin-password"}
    (secret,) = [
        s for s in of_kind(render("defaults"), "Secret") if s["metadata"]["name"] == ref["name"]
    ]
    assert len(base64.b64decode(secret["data"]["admin-password"])) >= 32
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    own = admin_password_ref("zookeeper-acl-own-secret")
    assert own == {"name": "my-zk-admin", "key": "admin-password"}
    assert of_kind(render("zookeeper-acl-own-secret"), "Secret") == []
    assert admin_password_ref("zookeeper-without-acl") is None
    assert of_kind(render("zookeeper-without-acl"), "Secret") == []


def zookeeper_policy(value_set: str, name: str = "rel-delayq-zookeeper") -> dict[str, Any]:
    policies = of_kind(render(value_set), "NetworkPolicy")
    (policy,) = [p for p in policies if p["metadata"]["name"] == name]
    return policy


def test_only_the_operator_service_pods_and_peers_reach_the_bundled_zookeeper() -> None:
    docs = render("namespaced")
    policy = zookeeper_policy("namespaced")
    (zookeeper,) = of_kind(docs, "StatefulSet")
    pod_labels = zookeeper["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    clients, peers = policy["spec"]["ingress"]
    assert [p["port"] for p in clients["ports"]] == [2181]
    operator_peer, *service_peers = clients["from"]
    assert operator_peer["podSelector"]["matchLabels"].items() >= naming.OPERATOR_POD_LABELS.items()
    # delay-service pods of the watched namespaces only, each named by the label the API server
    # sets (a tenant can copy pod labels, not rename its namespace)
    assert [peer["namespaceSelector"] for peer in service_peers] == [
        {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        for namespace in ("shop", "billing")
    ]
    service_labels = naming.topic_labels("any-topic", naming.COMPONENT_SERVICE)
    for peer in service_peers:
        assert peer["podSelector"]["matchLabels"].items() <= service_labels.items()
    assert [p["port"] for p in peers["ports"]] == [2181, 2888, 3888]
    assert peers["from"][0]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert not [p for p in of_kind(docs, "NetworkPolicy") if "clients" in p["metadata"]["name"]]
    assert [
        p
        for p in of_kind(render("single-replica-external-zk"), "NetworkPolicy")
        if p["metadata"]["name"].startswith("rel-delayq-zookeeper")
    ] == []


def test_cluster_wide_the_operator_keeps_the_zookeeper_clients_policy() -> None:
    """No namespace is admitted by the chart: the operator's own policy lists those holding
    DelayTopics (kube/zookeeper_clients.py), through a Role for that one policy."""
    docs = render("defaults")
    (clients, _) = zookeeper_policy("defaults")["spec"]["ingress"]
    assert [peer.keys() for peer in clients["from"]] == [{"podSelector"}]  # the operator only
    kept = zookeeper_policy("defaults", "rel-delayq-zookeeper-clients")
    assert kept["spec"] == {
        "podSelector": zookeeper_policy("defaults")["spec"]["podSelector"],
        "policyTypes": ["Ingress"],
    }  # no rules rendered: admits nothing, and an upgrade leaves the operator's rules alone
    name = kept["metadata"]["name"]
    (role,) = [r for r in of_kind(docs, "Role") if r["metadata"]["name"] == name]
    assert role["metadata"]["namespace"] == kept["metadata"]["namespace"]
    assert role["rules"] == [
        {
            "apiGroups": ["networking.k8s.io"],
            "resources": ["networkpolicies"],
            "resourceNames": ["rel-delayq-zookeeper-clients"],
            "verbs": ["get", "patch"],
        }
    ]
    (binding,) = [
        b for b in of_kind(docs, "RoleBinding") if b["metadata"]["name"] == role["metadata"]["name"]
    ]
    (deployment,) = of_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env[POLICY_ENV] == "rel-delayq-zookeeper-clients"
    assert OperatorConfig.from_env(env).zookeeper_clients_policy == "rel-delayq-zookeeper-clients"
    for value_set in ("namespaced", "single-replica-external-zk"):
        (deployment,) = of_kind(render(value_set), "Deployment")
        names = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert POLICY_ENV not in names


def test_the_bundled_zookeeper_enforces_quotas_and_bounds_connections_and_heap() -> None:
    (zookeeper,) = of_kind(render("defaults"), "StatefulSet")
    (container,) = zookeeper["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "enforceQuota=true" in env["ZOO_CFG_EXTRA"].split()  # the image's extra zoo.cfg lines
    assert env["ZOO_MAX_CLIENT_CNXNS"] == "60"
    heap_mib = int(env["ZK_SERVER_HEAP"])  # zkEnv.sh: -Xmx<n>m, 1000 by default
    limit = container["resources"]["limits"]["memory"]
    assert limit.endswith("Mi")
    assert heap_mib <= int(limit.removesuffix("Mi")) * 3 // 4
    for bad in (["--set", "zookeeper.maxClientCnxns=0"], ["--set", "zookeeper.heapMegabytes=8"]):
        assert run_helm("template", "rel", str(CHART), *bad).returncode != 0, bad


def test_values_schema_is_valid_json_schema() -> None:
    import jsonschema

    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load((CHART / "values.yaml").read_text()), schema)


def operator_container(value_set: str) -> dict[str, Any]:
    (deployment,) = of_kind(render(value_set), "Deployment")
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def test_operator_metrics_are_served_and_exposed_on_the_configured_port() -> None:
    config = OperatorConfig.from_env(operator_env("defaults"))
    assert config.metrics_endpoint == "http://0.0.0.0:8081/metrics"
    container = operator_container("defaults")
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"health": 8080, "metrics": 8081}
    docs = render("defaults")
    (service,) = [s for s in of_kind(docs, "Service") if s["metadata"]["name"].endswith("metrics")]
    assert service["metadata"]["name"] == "rel-delayq-operator-metrics"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "metrics"}]
    (deployment,) = of_kind(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert of_kind(docs, "ServiceMonitor") == []  # off unless asked: it needs the CRD


def test_the_operator_service_monitor_is_labelled_and_selects_the_metrics_service() -> None:
    docs = render("metrics-monitored")
    assert OperatorConfig.from_env(operator_env("metrics-monitored")).metrics_endpoint == (
        "http://0.0.0.0:9102/metrics"
    )
    (monitor,) = of_kind(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["metadata"]["namespace"] == "delayq-system"
    selected = [
        service
        for service in of_kind(docs, "Service")
        if monitor["spec"]["selector"]["matchLabels"].items()
        <= service["metadata"]["labels"].items()
    ]
    assert [service["metadata"]["name"] for service in selected] == ["rel-delayq-operator-metrics"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in selected[0]["spec"]["ports"]}
    assert (endpoint["path"], endpoint["interval"]) == ("/metrics", "30s")
    assert selected[0]["spec"]["ports"][0]["port"] == 9102


def test_operator_metrics_can_be_switched_off() -> None:
    docs = render("metrics-off")
    assert OperatorConfig.from_env(operator_env("metrics-off")).metrics_endpoint == ""
    assert [p["name"] for p in operator_container("metrics-off")["ports"]] == ["health"]
    assert not [s for s in of_kind(docs, "Service") if "metrics" in s["metadata"]["name"]]
    assert of_kind(docs, "ServiceMonitor") == []


def test_the_chart_refuses_clusters_without_the_crd_features_it_needs() -> None:
    for version, ok in (("1.29.9", False), ("1.30.0", True), ("1.33.13", True)):
        result = run_helm("template", "rel", str(CHART), "--kube-version", version)
        assert (result.returncode == 0) == ok, (version, result.stderr)
        if not ok:
            assert "kubeVersion" in result.stderr or "incompatible" in result.stderr


def test_helm_test_scrapes_the_operator_metrics_service_for_a_leader() -> None:
    docs = render("metrics-monitored")
    tests = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    (pod,) = tests
    assert pod["kind"] == "Pod"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    script = container["args"][0]
    assert "http://rel-delayq-operator-metrics.delayq-system.svc:9102/metrics" in script
    assert "delayq_operator_is_leader 1.0" in script
    compile(script, "helm-test", "exec")  # the script the pod runs is valid Python
    assert not [
        d
        for d in render("metrics-off")
        if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"
    ]


def test_topic_service_monitors_follow_the_chart_values() -> None:
    default = OperatorConfig.from_env(operator_env("defaults")).build.service_monitor
    assert (default.enabled, default.labels, default.interval) == (True, (), "30s")
    configured = OperatorConfig.from_env(operator_env("topic-monitors")).build.service_monitor
    assert configured.labels == (("release", "prom"), ("team", "ops"))
    assert configured.interval == "1m"
    off = OperatorConfig.from_env(operator_env("topic-monitors-off"))
    assert not off.build.service_monitor.enabled


def test_topic_and_zookeeper_pods_go_to_the_nodes_the_values_name() -> None:
    toleration = {"key": "pool", "value": "delayq", "effect": "NoSchedule"}
    placement = OperatorConfig.from_env(operator_env("dedicated-nodes")).build.placement
    assert placement.node_selector == (("pool", "delayq"),)
    assert placement.tolerations == (toleration,)
    assert OperatorConfig.from_env(operator_env("defaults")).build.placement == PodPlacement()
    (zookeeper,) = of_kind(render("dedicated-nodes"), "StatefulSet")
    pod = zookeeper["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "delayq"}
    assert pod["tolerations"] == [toleration]
    (default,) = of_kind(render("defaults"), "StatefulSet")
    assert "nodeSelector" not in default["spec"]["template"]["spec"]


def test_the_platforms_tracing_reaches_the_service_pods_as_otel_variables() -> None:
    """topics.tracing -> the operator's variables -> every traced topic's delay-service pods:
    the standard OTEL_* variables `delayq serve` exports by (service/tracing.py), the headers
    from the Secret of that name in the topic's namespace (the kubelet reads it), the
    collector's port opened in the pods' egress. Off by default: no OTEL_* at all."""
    tracing = OperatorConfig.from_env(operator_env("tracing")).build.tracing
    assert tracing == PodTracing(
        otlp_endpoint="http://otel-collector.observability.svc:4318",
        sampler="parentbased_traceidratio",
        sampler_arg="0.25",
        headers_secret="otel-ingest",
        headers_key="otlp-headers",
    )
    assert OperatorConfig.from_env(operator_env("defaults")).build.tracing == PodTracing()
    for value_set, traced in (("tracing", True), ("defaults", False)):
        ctx = OperatorConfig.from_env(operator_env(value_set)).build
        spec = TopicSpec(name="t", namespace="shop", topic_type=TopicType.STREAM)
        manifests = build_all(spec, ctx, CREDENTIALS, 64, True)
        sts = next(m for m in manifests if (m["kind"], m["metadata"]["name"]) == (
            "StatefulSet", "t-service"
        ))
        env = sts["spec"]["template"]["spec"]["containers"][0]["env"]
        otel = {e["name"]: e.get("value", e.get("valueFrom")) for e in env if "OTEL" in e["name"]}
        policies = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "NetworkPolicy"}
        policy = policies["t-service"]
        ports = {p.get("port") for rule in policy["spec"]["egress"] for p in rule["ports"]}
        assert (4318 in ports) is traced
        if not traced:
            assert otel == {}
            continue
        assert otel == {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector.observability.svc:4318",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_RESOURCE_ATTRIBUTES": (
                "k8s.namespace.name=shop,k8s.statefulset.name=t-service,k8s.pod.name=$(POD_NAME)"
            ),
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.25",
            "OTEL_EXPORTER_OTLP_HEADERS": {
                "secretKeyRef": {"name": "otel-ingest", "key": "otlp-headers", "optional": True}
            },
        }
        names = [e["name"] for e in env]  # $(POD_NAME) refers to a variable defined before
        assert names.index("POD_NAME") < names.index("OTEL_RESOURCE_ATTRIBUTES")
        plain = {name: value for name, value in otel.items() if isinstance(value, str)}
        assert wanted(plain)  # what `delayq serve` turns tracing on by
        assert Tracing.from_env(plain) is not None  # and the protocol it exports with


def test_operator_logs_json_unless_text_is_asked_for() -> None:
    assert operator_container("topic-monitors-off")["args"] == ["operator"]


def exported_series() -> dict[str, set[str]]:
    """Every sample name the operator and a delay service export, with its label names (also
    of labelled metrics that have no series yet)."""
    from prometheus_client.metrics import MetricWrapperBase

    from delayq.coordination.zookeeper import ZkOwnership, ZkSettings
    from delayq.kube.metrics import OperatorMetrics
    from delayq.service.metrics import ServiceMetrics

    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    series: dict[str, set[str]] = {}
    service = ServiceMetrics("ns", "t")
    # a ZooKeeper-coordinated process's session (never started: nothing connects)
    service.watch_session(
        ZkOwnership(ZkSettings(hosts="127.0.0.1:1", namespace="ns", topic="t", slot_amount=1))
    )
    for metrics in (OperatorMetrics(), service):
        for wrapper in vars(metrics).values():
            if isinstance(wrapper, MetricWrapperBase):
                kind = str(wrapper._type)
                labels = set(wrapper._labelnames) | ({"le"} if kind == "histogram" else set())
                for suffix in suffixes.get(kind, ("",)):
                    series.setdefault(wrapper._name + suffix, set()).update(labels)
        for family in metrics.registry.collect():
            for sample in family.samples:
                series.setdefault(sample.name, set()).update(sample.labels)
    return series


def test_alerts_name_only_series_the_code_exports() -> None:
    import re

    assert of_kind(render("defaults"), "PrometheusRule") == []  # off unless asked
    (rule,) = of_kind(render("alerts"), "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert {r["alert"] for r in rules} >= {
        "DelayqOperatorNoLeader",
        "DelayqBrokerMemoryHigh",
        "DelayqBrokerFull",
        "DelayqSlotsUnowned",
        "DelayqDeadMessages",
        "DelayqBrokerFailover",
        "DelayqDeliveryOverdue",
        "DelayqDeliveryLate",
        "DelayqZooKeeperSessionDown",
    }
    series = exported_series()
    target_labels = {"namespace", "pod"}  # set by Prometheus' discovery on every series
    for alert in rules:
        assert alert["labels"]["severity"] in ("warning", "critical")
        expr = alert["expr"]
        names = re.findall(r"delayq_[a-z_]+", expr)
        assert names, alert["alert"]
        for name in names:
            assert name in series, f"{alert['alert']}: {name} is not exported"
        for grouping in re.finditer(r"by \(([^)]*)\) ", expr):
            # the series of the aggregation's argument: up to its closing parenthesis
            depth, end = 0, grouping.end()
            for end in range(grouping.end(), len(expr)):
                depth += {"(": 1, ")": -1}.get(expr[end], 0)
                if depth == 0:
                    break
            aggregated = re.findall(r"delayq_[a-z_]+", expr[grouping.end() : end])
            assert aggregated, f"{alert['alert']}: by ({grouping.group(1)}) of no series"
            for label in (item.strip() for item in grouping.group(1).split(",")):
                assert label in target_labels or all(
                    label in series[name] for name in aggregated
                ), f"{alert['alert']}: no {label} label on {aggregated}"


def test_the_grafana_dashboard_queries_series_the_code_exports() -> None:
    import re

    defaults = of_kind(render("defaults"), "ConfigMap")
    assert not [c for c in defaults if "dashboards" in c["metadata"]["name"]]
    (config_map,) = [
        c
        for c in of_kind(render("dashboards"), "ConfigMap")
        if c["metadata"]["name"] == "rel-delayq-dashboards"
    ]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"  # the sidecar's label
    assert config_map["metadata"]["namespace"] == "monitoring"
    dashboard = json.loads(config_map["data"]["delayq.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "delayq.json").read_text())
    series = exported_series()
    queries = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    variables = dashboard["templating"]["list"]
    queries += [v["query"]["query"] for v in variables if v["type"] == "query"]
    assert len(queries) >= 10
    for query in queries:
        names = re.findall(r"delayq_[a-z_]+", query)
        assert names, query
        for name in names:
            assert name in series, f"{name} is not exported: {query}"
        used = set(re.findall(r"([a-z_]+)=~", query)) | {
            label.strip()
            for grouping in re.findall(r"by \(([^)]*)\)", query)
            for label in grouping.split(",")
        }
        # every series names the topic's namespace `topic_namespace`; `namespace` is the
        # scraped pod's (Prometheus' target label), never a topic selector
        for label in used:
            assert any(label in series[name] for name in names), f"no {label}: {query}"


def test_the_zookeeper_transaction_log_is_on_the_data_volume() -> None:
    (zookeeper,) = of_kind(render("defaults"), "StatefulSet")
    pod = zookeeper["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    log_dir = env["ZOO_DATA_LOG_DIR"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    # the deepest mount holding the log directory is the claim template's volume, not an emptyDir
    holder = max((path for path in mounts if log_dir.startswith(path.rstrip("/") + "/")), key=len)
    assert mounts[holder] == "data"
    assert {t["metadata"]["name"] for t in zookeeper["spec"]["volumeClaimTemplates"]} == {"data"}
    assert "data" not in {volume["name"] for volume in pod["volumes"]}


def test_the_chart_works_as_a_subchart_with_global_values() -> None:
    # A parent chart passes `global` to every subchart; a schema refusing it makes the chart
    # unusable as a dependency.
    result = run_helm("template", "rel", str(CHART), "--set", "global.imageRegistry=r.example")
    assert result.returncode == 0, result.stderr



def test_the_lateness_alert_holds_each_topic_to_its_objective_else_the_values() -> None:
    """DelayqDeliveryLate compares each topic's p99 with its spec.objectives.latenessP99, as the
    operator exports it (its own namespace's series), and a topic without one with
    `alerts.latenessP99Seconds` (default 1 s)."""
    values = ["--set", "alerts.enabled=true", "--set-json", "alerts.latenessP99Seconds=0.25"]
    for extra, threshold in (([], "1"), (values, "0.25")):
        args = ["template", "rel", str(CHART), "--namespace", "delayq-system"]
        result = run_helm(*args, *(extra or ["--set", "alerts.enabled=true"]))
        assert result.returncode == 0, result.stderr
        docs = tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)
        (rule,) = of_kind(docs, "PrometheusRule")
        rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
        (late,) = [r for r in rules if r["alert"] == "DelayqDeliveryLate"]
        p99 = (
            "histogram_quantile(0.99, sum by (topic_namespace, topic, le) "
            "(rate(delayq_delivery_lateness_seconds_bucket[5m])))"
        )
        objective = (
            "max by (topic_namespace, topic) "
            '(delayq_operator_lateness_objective_seconds{namespace="delayq-system"})'
        )
        assert late["expr"] == (
            f"({p99} > on (topic_namespace, topic) {objective}) or "
            f"({p99} > {threshold} unless on (topic_namespace, topic) {objective})"
        )
