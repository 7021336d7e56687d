"""Provisioning: make a DelayTopic's children and ZooKeeper entries match its spec.

Runs on create, resume and update (level-based: it always converges to the whole desired state,
so it does not matter which change triggered it). Returns the status patch to write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from delayq.coordination.routing import RoutingConflict, plan_routing
from delayq.kube import naming
from delayq.kube.apply import ensure, remove, write_secret
from delayq.kube.builders.bundle import build_retired, render
from delayq.kube.builders.service import zookeeper_connect
from delayq.kube.client import KubeApiError
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.credentials import (
    MISSING_REASON,
    CredentialsCopyMissing,
    read_or_generate_credentials,
    save_copy,
)
from delayq.kube.ensembles import EnsembleRefused
from delayq.kube.errors import TRANSIENT_ERRORS, TopicFailure
from delayq.kube.handlers.restore import read_or_restore
from delayq.kube.pairing import ServicePodPlacement
from delayq.kube.routing_record import RECORD_FIELD, RoutingRecordInvalid, routing_record
from delayq.kube.spec import SpecError
from delayq.kube.status import (
    FALSE,
    PROVISIONED,
    READY,
    TRUE,
    UNKNOWN,
    Condition,
    observed_ready,
)
from delayq.kube.tenant_policy import REFUSED_REASON
from delayq.kube.topics import parse_body, with_conditions

TRANSIENT_DELAY_S = 15.0
APPLY_FAILED_DELAY_S = 60.0


def paused_patch(ctx: OperatorContext, body: Mapping[str, Any]) -> dict[str, Any]:
    message = f"Reconciliation is paused by the {naming.PAUSED_ANNOTATION} annotation."
    return with_conditions(ctx, body, [Condition(PROVISIONED, UNKNOWN, "Paused", message)])


async def reconcile(
    ctx: OperatorContext, body: Mapping[str, Any], logger: Logger
) -> dict[str, Any]:
    """Provision everything; raise TopicFailure (with its status patch) when it cannot."""
    meta = body.get("metadata") or {}
    if naming.is_paused(meta.get("annotations")):
        logger.info("paused: not reconciling")
        return paused_patch(ctx, body)
    generation = meta.get("generation")
    try:
        spec = parse_body(body)
    except SpecError as error:
        raise refused(ctx, body, "InvalidSpec", str(error)) from None
    # before anything is applied: no pod may start with what the platform does not allow,
    # and the operator connects to no ensemble the platform does not allow
    try:
        connect = zookeeper_connect(spec, ctx.build)
        refusal = ctx.config.tenant_policy.refusal(spec.delivery)
    except EnsembleRefused as error:
        refusal = str(error)
    if refusal is not None:
        message = f"{refusal} Nothing is rolled out; running pods keep their settings."
        raise refused(ctx, body, REFUSED_REASON, message)

    status = body.get("status") or {}
    applied = int(status.get("appliedSlotAmount") or spec.slot_amount)
    slot_condition = slot_amount_condition(spec.slot_amount, applied)
    # the pods get the desired amount at once: they serve the routing's (docs/operator.md,
    # "Doubling the slots"), so the split that follows needs no second roll
    rendered = max(spec.slot_amount, applied)
    try:
        credentials = await read_or_generate_credentials(ctx, body, spec)
        with_monitor = ctx.build.service_monitor.enabled and await ctx.kube.has_resource(
            "monitoring.coreos.com/v1", "servicemonitors"
        )
        manifests = render(body, spec, ctx.build, credentials.values, rendered, with_monitor)
        # the Secrets first (written, never read: kube/credentials.py), then the operator's copy
        secrets = [manifest for manifest in manifests if manifest["kind"] == "Secret"]
        for manifest in secrets:
            if await write_secret(ctx.kube, manifest, credentials.kept_keys) == "created":
                logger.info("created Secret/%s", manifest["metadata"]["name"])
        await save_copy(ctx, spec, credentials)
        placement = ServicePodPlacement(
            ctx.kube, spec.namespace, spec.name, spec.brokers, ctx.pairing_wait_s
        )
        for manifest in manifests:
            if manifest["kind"] != "Secret":
                outcome = await ensure(ctx.kube, manifest, placement.before_create)
                if outcome != "unchanged":
                    kind, name = manifest["kind"], manifest["metadata"]["name"]
                    logger.info("%s %s/%s", outcome, kind, name)
        # after the pods' templates stopped naming them (the reader's policy admits its peers)
        for reference in build_retired(spec):
            if await remove(ctx.kube, reference, str(meta.get("uid") or "")) == "deleted":
                logger.info("deleted %s/%s", reference["kind"], reference["metadata"]["name"])
        # ZooKeeper last: an unreachable ensemble must not stop the pods from coming up.
        current = await read_or_restore(
            ctx, body, spec, credentials.values.zookeeper_password, logger
        )
        routing = plan_routing(rendered, spec.brokers, current)
        await ctx.store.publish(
            connect,
            spec.namespace,
            spec.name,
            routing,
            credentials.values.zookeeper_password,
            uid=str(meta.get("uid") or ""),
        )
        applied = routing.slot_amount  # what the topic serves: growth comes by a split
    except CredentialsCopyMissing as error:
        raise refused(ctx, body, MISSING_REASON, str(error)) from None
    except RoutingConflict as error:
        raise refused(ctx, body, "RoutingConflict", str(error)) from None
    except RoutingRecordInvalid as error:
        message = (
            f"ZooKeeper has no routing for the topic and {error}; nothing is published. Fix "
            f"the copy (or remove status.{RECORD_FIELD} if no slot ever moved or doubled: the "
            "first routing is then the right one); retrying."
        )
        condition = Condition(PROVISIONED, FALSE, "RoutingRecordInvalid", message)
        patch = with_conditions(ctx, body, [condition])
        raise TopicFailure(message, patch, False, APPLY_FAILED_DELAY_S) from None
    except KubeApiError as error:
        reason = "ApiUnavailable" if error.transient else "ApplyFailed"
        delay = TRANSIENT_DELAY_S if error.transient else APPLY_FAILED_DELAY_S
        patch = with_conditions(ctx, body, [Condition(PROVISIONED, FALSE, reason, str(error))])
        raise TopicFailure(str(error), patch, permanent=False, delay_s=delay) from None
    except TRANSIENT_ERRORS as error:
        message = f"ZooKeeper or the network failed: {error!r}; retrying"
        condition = Condition(PROVISIONED, FALSE, "ZooKeeperUnavailable", message)
        patch = with_conditions(ctx, body, [condition])
        raise TopicFailure(message, patch, False, TRANSIENT_DELAY_S) from None

    ready = observed_ready(status, slot_condition, spec.brokers)
    fields = {
        "observedGeneration": generation,
        "appliedSlotAmount": applied,
        RECORD_FIELD: routing_record(routing),
    }
    return with_conditions(ctx, body, [slot_condition, ready], **fields)


def refused(
    ctx: OperatorContext, body: Mapping[str, Any], reason: str, message: str
) -> TopicFailure:
    """A permanent failure: Provisioned and Ready False with `reason` until the spec changes
    (kopf does not retry it; the next change, or the operator's restart, reconciles again)."""
    conditions = [Condition(kind, FALSE, reason, message) for kind in (PROVISIONED, READY)]
    generation = (body.get("metadata") or {}).get("generation")
    patch = with_conditions(ctx, body, conditions, observedGeneration=generation)
    return TopicFailure(message, patch, permanent=True)


def slot_amount_condition(desired: int, applied: int) -> Condition:
    """Provisioned, or why a shrink of slotAmount was refused (a topic stored before the CEL
    rule that refuses it). Growth is provisioned: the health pass splits the slots and its
    Resharding condition shows the progress."""
    if desired < applied:
        return Condition(
            PROVISIONED,
            FALSE,
            "SlotAmountShrinkRejected",
            f"slotAmount may never shrink (from {applied} to {desired}); the topic keeps "
            f"serving {applied} slots.",
        )
    return Condition(PROVISIONED, TRUE, "ResourcesApplied", "All resources are applied.")
