"""The platform's cap on the SSRF guard's opt-outs: the pure check, then the reconcile refusing a
topic that asks for more (kmock as the API, the session's real ZooKeeper)."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import kmock
import pytest
from kazoo.client import KazooClient

from delayq.kube import naming
from delayq.kube.config import OperatorConfig
from delayq.kube.context import OperatorContext
from delayq.kube.handlers.health import refresh
from delayq.kube.handlers.reconcile import reconcile
from delayq.kube.recorder import REPEAT_AFTER_S
from delayq.kube.spec import Delivery
from delayq.kube.tenant_policy import REFUSED_REASON, TenantPolicy
from delayq.service.delivery.targets import parse_cidrs
from tests.kube.conftest import Clock, own_slots, topic_tree_exists
from tests.kube.pods import RedisPods, add_service_pods
from tests.kube.test_events import posted, run
from tests.kube.test_handlers import (
    STS,
    body,
    condition,
    existing,
    get,
    put_topic,
    update_spec,
)

CLUSTER_SERVICES = "10.96.0.0/12"
POLICIES = "networking.k8s.io/v1/networkpolicies"


def policy(*cidrs: str, allow_private_targets: bool = False) -> TenantPolicy:
    return TenantPolicy(allow_private_targets, parse_cidrs(cidrs))


def hook(*cidrs: str, allow_private_targets: bool = False) -> Delivery:
    return Delivery(
        webhook_url="https://hooks.example/h",
        webhook_allow_private_targets=allow_private_targets,
        webhook_allowed_cidrs=cidrs,
    )


# --- the pure check ---------------------------------------------------------------------------


def test_the_default_cap_admits_public_targets_only() -> None:
    assert TenantPolicy().refusal(hook()) is None
    reason = TenantPolicy().refusal(hook(allow_private_targets=True))
    assert reason is not None
    assert reason.startswith("spec.delivery.webhook.allowPrivateTargets: true is not allowed")
    assert "tenantPolicy.allowPrivateTargets: false" in reason
    reason = TenantPolicy().refusal(hook(CLUSTER_SERVICES))
    assert reason is not None
    assert reason.startswith(f"spec.delivery.webhook.allowedCidrs[0] {CLUSTER_SERVICES} is")
    assert "tenantPolicy.allowedCidrs (none)" in reason


@pytest.mark.parametrize(
    "cidrs",
    [
        (CLUSTER_SERVICES,),
        ("10.96.4.0/24", "10.100.0.1/32"),  # narrower ones
        ("10.96.7.7/12",),  # host bits, as the spec admits them
        ("fd00:1::/64",),
    ],
)
def test_cidrs_inside_the_platforms_are_admitted(cidrs: tuple[str, ...]) -> None:
    assert policy(CLUSTER_SERVICES, "fd00::/8").refusal(hook(*cidrs)) is None


@pytest.mark.parametrize(
    ("cidrs", "index", "shown"),
    [
        (("10.0.0.0/8",), 0, "10.0.0.0/8"),  # wider than the platform's
        ((CLUSTER_SERVICES, "169.254.169.254/32"), 1, "169.254.169.254/32"),
        (("0.0.0.0/0",), 0, "0.0.0.0/0"),
        (("fc00::/7",), 0, "fc00::/7"),
        (("::ffff:10.96.0.0/108",), 0, "::ffff:a60:0/108"),  # mapped: as written, not inside
    ],
)
def test_a_cidr_outside_the_platforms_is_refused_by_index(
    cidrs: tuple[str, ...], index: int, shown: str
) -> None:
    reason = policy(CLUSTER_SERVICES, "fd00::/8").refusal(hook(*cidrs))
    assert reason is not None
    assert reason.startswith(f"spec.delivery.webhook.allowedCidrs[{index}] {shown} is outside")
    assert f"tenantPolicy.allowedCidrs ({CLUSTER_SERVICES}, fd00::/8)" in reason


def test_a_platform_allowing_private_targets_admits_every_opt_out() -> None:
    anything = policy(allow_private_targets=True)
    assert anything.refusal(hook(allow_private_targets=True)) is None
    assert anything.refusal(hook("0.0.0.0/0")) is None
    # a CIDR cap alone never admits allowPrivateTargets
    assert policy("0.0.0.0/0").refusal(hook(allow_private_targets=True)) is not None


def test_the_cap_comes_from_the_operators_environment() -> None:
    assert OperatorConfig.from_env({}).tenant_policy == TenantPolicy()
    config = OperatorConfig.from_env(
        {
            "DELAYQ_TENANT_ALLOW_PRIVATE_TARGETS": "true",
            "DELAYQ_TENANT_ALLOWED_CIDRS": " 10.96.0.0/12, fd00::/8 ,",
        }
    )
    assert config.tenant_policy == policy(CLUSTER_SERVICES, "fd00::/8", allow_private_targets=True)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DELAYQ_TENANT_ALLOWED_CIDRS": "10.0.0.0/8,lan"}, "DELAYQ_TENANT_ALLOWED_CIDRS: 'lan'"),
        ({"DELAYQ_TENANT_ALLOW_PRIVATE_TARGETS": "maybe"}, "must be true or false"),
    ],
)
def test_a_bad_cap_stops_the_operator_with_the_variables_name(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        OperatorConfig.from_env(env)


# --- the reconcile ----------------------------------------------------------------------------


def webhook(**settings: Any) -> dict[str, Any]:
    return {"webhook": {"url": "https://hooks.example/h", **settings}}


def rolled_out(api: kmock.KubernetesEmulator) -> tuple[Any, ...]:
    """What the service pods run with: topic.json, the pod template, the egress policy."""
    config = json.loads(existing(api, "v1/configmaps", "orders-config")["data"][naming.CONFIG_KEY])
    template = existing(api, STS, "orders-service")["spec"]["template"]
    egress = existing(api, POLICIES, "orders-service")["spec"]["egress"]
    return config, template, egress


async def test_a_topic_asking_more_than_the_platform_allows_is_refused_and_keeps_its_pods(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    clock: Clock,
    logger: logging.Logger,
) -> None:
    ctx.config = dataclasses.replace(ctx.config, tenant_policy=policy(CLUSTER_SERVICES))
    put_topic(api, topicType="webhook", delivery=webhook(allowedCidrs=["10.96.0.0/16"]))
    await run(ctx, api, logger, reconcile)
    assert condition(api, "Provisioned")["reason"] == "ResourcesApplied"
    before = rolled_out(api)
    assert before[0]["webhook_allowed_cidrs"] == "10.96.0.0/16"
    events = len(posted(api))

    update_spec(api, delivery=webhook(allowedCidrs=["10.96.0.0/16"], allowPrivateTargets=True))
    await run(ctx, api, logger, reconcile)
    for kind in ("Provisioned", "Ready"):
        refused = condition(api, kind)
        assert (refused["status"], refused["reason"]) == ("False", REFUSED_REASON)
        assert "allowPrivateTargets: true is not allowed" in refused["message"]
        assert "tenantPolicy.allowPrivateTargets: false" in refused["message"]
        assert refused["observedGeneration"] == 2
    assert posted(api)[events:] == [("Warning", REFUSED_REASON)]
    assert rolled_out(api) == before  # nothing rolled out, the pods keep what they had

    update_spec(api, delivery=webhook(allowedCidrs=["10.0.0.0/8"], allowPrivateTargets=False))
    await run(ctx, api, logger, reconcile)
    message = condition(api, "Ready")["message"]
    assert message.startswith("spec.delivery.webhook.allowedCidrs[0] 10.0.0.0/8 is outside")
    assert f"tenantPolicy.allowedCidrs ({CLUSTER_SERVICES})" in message
    assert rolled_out(api) == before

    # brought within the cap (later than the recorder's repeat window): applied, rolled, told
    clock.now += REPEAT_AFTER_S
    update_spec(api, delivery=webhook(allowedCidrs=["10.96.0.0/24"], allowPrivateTargets=False))
    await run(ctx, api, logger, reconcile)
    assert condition(api, "Provisioned")["reason"] == "ResourcesApplied"
    config, template, egress = rolled_out(api)
    assert config["webhook_allowed_cidrs"] == "10.96.0.0/24"
    assert template != before[1]
    assert {"ipBlock": {"cidr": "10.96.0.0/24"}} in egress[-1]["to"]
    assert posted(api)[-1] == ("Normal", "ResourcesApplied")
    assert body(api)["status"]["observedGeneration"] == 4


async def test_a_new_topic_over_the_cap_gets_no_children(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, zk: KazooClient, logger: logging.Logger
) -> None:
    put_topic(api, topicType="webhook", delivery=webhook(allowedCidrs=[CLUSTER_SERVICES]))
    await run(ctx, api, logger, reconcile)
    assert condition(api, "Ready")["reason"] == REFUSED_REASON
    assert posted(api) == [("Warning", REFUSED_REASON)]
    for resource, name in (
        ("v1/secrets", "orders-credentials"),
        ("v1/configmaps", "orders-config"),
        (STS, "orders-service"),
        (POLICIES, "orders-service"),
    ):
        assert get(api, resource, name) is None
    assert not topic_tree_exists(zk)

    # corrected: Ready waits for brokers at once, no longer the refusal
    update_spec(api, topicType="webhook", delivery=webhook(allowedCidrs=[]))
    await run(ctx, api, logger, reconcile)
    ready = condition(api, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "WaitingForBrokers")


async def test_a_corrected_refusal_is_serving_again_without_waiting_for_a_health_pass(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk: KazooClient,
    redis_pods: RedisPods,
    clock: Clock,
    logger: logging.Logger,
) -> None:
    """The reconcile that applies the corrected spec derives Ready from the last health pass's
    observations: Serving again at once, not a health interval (healthIntervalSeconds) later."""
    ctx.config = dataclasses.replace(ctx.config, tenant_policy=policy(CLUSTER_SERVICES))
    shape: dict[str, Any] = {"topicType": "webhook", "slotAmount": 4, "replicasPerBroker": 0}
    put_topic(api, **shape, delivery=webhook(allowedCidrs=["10.96.0.0/16"]))
    await run(ctx, api, logger, reconcile)
    redis_pods.add(0, 1, master=0)
    add_service_pods(api, 1)
    own_slots(zk, 4)
    await run(ctx, api, logger, refresh)
    assert condition(api, "Ready")["reason"] == "Serving"

    update_spec(api, **shape, delivery=webhook(allowedCidrs=["10.0.0.0/8"]))
    await run(ctx, api, logger, reconcile)
    assert condition(api, "Ready")["reason"] == REFUSED_REASON
    clock.now += REPEAT_AFTER_S  # past the recorder's window: Serving is told again
    events = len(posted(api))
    update_spec(api, **shape, delivery=webhook(allowedCidrs=["10.96.0.0/16"]))
    await run(ctx, api, logger, reconcile)  # no health pass in between
    ready = condition(api, "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Serving")
    assert ready["observedGeneration"] == 3
    assert ("Normal", "Serving") in posted(api)[events:]
