"""The platform's limits on its tenants (issues 13 and 27): a change the API server admits but
the platform's `tenantPolicy` or its ZooKeeper ensembles refuse is refused by the operator
before anything is applied, and told where a tenant looks (`kubectl describe dt`)."""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.kube.listener import SilentListener

from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from e2e.harness.kube import Kube, Release
from e2e.harness.operator import LocalOperator, chart_env, tenant_namespace
from e2e.harness.process import INTERVAL_S, NOT_YET, REPO
from e2e.harness.topics import (
    delay_topic,
    described_with,
    ready_condition,
    topic_children,
    wait_reconciled,
)


def test_a_change_beyond_the_platforms_cap_is_refused_and_told_in_describe(
    kube: Kube, operator_kubeconfig: Path, chart_release: Release, zookeeper: ZooKeeperServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Events for refused changes (issue 13): a change the API server admits but the platform's
    `tenantPolicy` does not (an operator with the chart's default: no private targets) is
    refused before anything is applied: Ready False with `TenantPolicyExceeded` naming the
    field, one Warning Event in `kubectl describe dt`, the delay-service pods' template and
    egress as they were. Brought back within the cap, the topic is provisioned again."""
    ns = f"e2e-capped-{secrets.token_hex(3)}"
    tenant_namespace(kube, chart_release, ns)
    workdir = tmp_path_factory.mktemp("capped")
    op = LocalOperator(
        repo=REPO, kubeconfig=operator_kubeconfig, namespaces=[ns],
        log_path=workdir / "operator.log",
        env_overrides={**chart_env(kube, chart_release, zookeeper),
                       "DELAYQ_TENANT_ALLOW_PRIVATE_TARGETS": "false",
                       "DELAYQ_HEALTH_INTERVAL_S": "2"},
    ).start()
    hook = {"url": "https://hooks.example.com/delayq"}

    def capped(**webhook: Any) -> dict[str, Any]:
        return delay_topic("capped", slotAmount=16, brokers=1, replicasPerBroker=0,
                           topicType="webhook", delivery={"webhook": {**hook, **webhook}})

    try:
        kube.apply(capped(), ns)
        wait_reconciled(kube, op, ns, "capped")
        template = kube.get("statefulset", "capped-service", ns)
        policy = kube.get("networkpolicy", "capped-service", ns)
        assert template is not None
        assert policy is not None

        kube.apply(capped(allowPrivateTargets=True), ns)
        refused = kube.wait(
            lambda: (ready := ready_condition(kube, ns, "capped")).get("reason")
            == "TenantPolicyExceeded" and ready, timeout_s=60,
            what="Ready=False, TenantPolicyExceeded")
        assert refused["status"] == "False"
        field = "spec.delivery.webhook.allowPrivateTargets: true is not allowed"
        assert refused["message"].startswith(field)
        described = wait_until(
            lambda: described_with(kube, ns, "capped", ("TenantPolicyExceeded",)),
            timeout_s=30, what="the TenantPolicyExceeded Event in kubectl describe",
            interval_s=INTERVAL_S, not_yet=NOT_YET)
        events = described.partition("\nEvents:")[2]
        assert re.search(r"Warning\s+TenantPolicyExceeded", events), events
        assert field in events
        after = kube.get("statefulset", "capped-service", ns)
        assert after is not None
        assert after["spec"]["template"] == template["spec"]["template"], "the pods were rolled"
        policy_after = kube.get("networkpolicy", "capped-service", ns)
        assert policy_after is not None
        assert policy_after["spec"] == policy["spec"], "the refused targets were admitted"

        kube.apply(capped(), ns)
        wait_reconciled(kube, op, ns, "capped")
        # Ready past the refusal from the correcting reconcile, as the last health pass saw
        # the brokers (KWOK: no Redis answers, so not Serving)
        kube.wait(lambda: ready_condition(kube, ns, "capped").get("reason")
                  != "TenantPolicyExceeded", timeout_s=30, what="Ready past the refusal")
        reasons = [e["reason"] for e in kube.items("events", ns)
                   if e["involvedObject"]["name"] == "capped"]
        assert reasons.count("TenantPolicyExceeded") == 1, reasons
    except Exception:
        print(f"--- capped operator log tail:\n{op.tail()}")
        raise
    finally:
        kube.kubectl("delete", "dt", "capped", "-n", ns, "--wait=false", check=False)
        op.stop()
        kube.kubectl("delete", "namespace", ns, "--wait=false")


def test_a_zookeeper_the_tenant_runs_never_sees_the_operator(
    kube: Kube, operator_kubeconfig: Path, chart_release: Release, zookeeper: ZooKeeperServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Issue 27, attacks 1 and 2 on the real API server: a topic naming a ZooKeeper its tenant
    runs (a listener recording every byte it is sent) is refused by the operator, logged in
    as admin, before anything is applied: Ready False `TenantPolicyExceeded` naming
    `spec.zookeeper.connect`, a Warning Event, no child, and no connection at all to the
    listener; a chroot into another topic's tree is refused by the API server. A topic on the
    platform's ensemble is provisioned meanwhile."""
    ns = f"e2e-zk-{secrets.token_hex(3)}"
    tenant_namespace(kube, chart_release, ns)
    workdir = tmp_path_factory.mktemp("zk-thief")
    env = chart_env(kube, chart_release, zookeeper)
    op = LocalOperator(
        repo=REPO, kubeconfig=operator_kubeconfig, namespaces=[ns],
        log_path=workdir / "operator.log",
        env_overrides={**env, "DELAYQ_HEALTH_INTERVAL_S": "2"},
    ).start()
    listener = SilentListener()
    shape: dict[str, Any] = {"slotAmount": 16, "brokers": 1, "replicasPerBroker": 0}
    try:
        kube.apply(delay_topic("thief", **shape, zookeeper={"connect": listener.connect}), ns)
        kube.apply(delay_topic("victim", **shape), ns)
        refused = kube.wait(
            lambda: (ready := ready_condition(kube, ns, "thief")).get("reason")
            == "TenantPolicyExceeded" and ready, timeout_s=60,
            what="Ready=False, TenantPolicyExceeded")
        assert refused["message"].startswith(f"spec.zookeeper.connect '{listener.connect}'")
        wait_reconciled(kube, op, ns, "victim")
        described = wait_until(
            lambda: described_with(kube, ns, "thief", ("TenantPolicyExceeded",)),
            timeout_s=30, what="the TenantPolicyExceeded Event in kubectl describe",
            interval_s=INTERVAL_S, not_yet=NOT_YET)
        assert re.search(r"Warning\s+TenantPolicyExceeded", described.partition("\nEvents:")[2])
        assert topic_children(kube, ns, "thief") == []

        members = f"{zookeeper.hosts}/delayq/{ns}/victim/members"
        squatter = delay_topic("squatter", **shape, zookeeper={"connect": members})
        applied = kube.kubectl("apply", "-f", "-", "-n", ns, input=yaml.safe_dump(squatter),
                               check=False)
        assert applied.returncode != 0
        assert "spec.zookeeper.connect" in applied.stderr, applied.stderr
        assert listener.connections == 0
        assert env["DELAYQ_ZOOKEEPER_ADMIN_PASSWORD"].encode() not in listener.received
    except Exception:
        print(f"--- zk-thief operator log tail:\n{op.tail()}")
        raise
    finally:
        listener.close()
        kube.kubectl("delete", "dt", "--all", "-n", ns, "--wait=false", check=False)
        op.stop()
        kube.kubectl("delete", "namespace", ns, "--wait=false")
