"""The platform's limits on its tenants (issue 13): a change the API server admits but the
platform's `tenantPolicy` refuses is refused by the operator before anything is applied, and
told where a tenant looks (`kubectl describe dt`)."""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Any

import pytest

from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from e2e.harness.kube import Kube, Release
from e2e.harness.operator import LocalOperator, chart_env, tenant_namespace
from e2e.harness.process import INTERVAL_S, NOT_YET, REPO
from e2e.harness.topics import delay_topic, described_with, ready_condition, wait_reconciled


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
