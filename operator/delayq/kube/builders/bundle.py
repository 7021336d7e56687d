"""Everything one DelayTopic owns, in apply order, adopted by the topic (owner references).

Kept pure: the handler supplies the credentials (read from the existing Secret or freshly
generated) and whether the ServiceMonitor CRD exists; this module only assembles manifests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf

from delayq.kube import naming
from delayq.kube.builders import backup, redis, service
from delayq.kube.builders.common import (
    BuildContext,
    Credentials,
    Manifest,
    ServiceMonitorSettings,
    has_stream_reader,
)
from delayq.kube.spec import TopicSpec


def build_all(
    spec: TopicSpec,
    ctx: BuildContext,
    credentials: Credentials,
    slot_amount: int,
    with_service_monitor: bool,
) -> list[Manifest]:
    """All children, not yet owned, in apply order.

    Secret and ConfigMap first, so pods find them at start. The delay-service StatefulSet
    before the Redis ones: Redis pod placement looks for service pod `i` (redis_affinity), so
    it must already be placed; the service pods restart with backoff until their broker answers
    and stay unready meanwhile, which is harmless.
    """
    manifests: list[Manifest] = [
        service.credentials_secret(spec, credentials),
        service.config_map(spec, ctx, slot_amount),
        redis.redis_network_policy(spec, ctx),
        service.service_network_policy(spec, ctx),
        service.service_headless_service(spec),
        service.api_service(spec),
        service.service_statefulset(spec, ctx, slot_amount),
        service.service_pdb(spec),
    ]
    if has_stream_reader(spec):  # before the Redis pods, which read the reader's password
        manifests += [
            redis.stream_reader_secret(spec, credentials),
            redis.stream_reader_network_policy(spec),
        ]
    for broker in range(spec.brokers):
        manifests += [
            redis.redis_headless_service(spec, broker),
            redis.redis_master_service(spec, broker),
            redis.redis_statefulset(spec, broker, ctx),
            redis.redis_pdb(spec, broker),
        ]
    if with_service_monitor and ctx.service_monitor.enabled:
        manifests.append(configured_monitor(service.service_monitor(spec), ctx.service_monitor))
    if spec.backup is not None:  # last: written only where workloads are (as StatefulSets)
        manifests.append(backup.backup_cron_job(spec, spec.backup, ctx))
    return manifests


def build_retired(spec: TopicSpec) -> list[Manifest]:
    """References (apiVersion, kind, name, namespace) to the children an earlier spec of the
    topic rendered and this one does not, for the reconcile to delete: the stream reader's
    NetworkPolicy once nobody reads broker 0 (`urlSecretRef` set, or another topicType), so it
    stops admitting the former consumers to its Redis port. The reader's Secret stays until the
    topic goes (owner references): deleting it needs `get` and `delete` on Secrets in the
    tenant's namespace, which the operator does not hold, and its password opens nothing once
    broker 0 rolled without the reader user. And the backups' CronJob once `spec.backup` is
    removed (its Jobs and pods go with it)."""
    retired: list[Manifest] = []
    if not has_stream_reader(spec):
        retired.append(
            reference(
                "networking.k8s.io/v1",
                "NetworkPolicy",
                spec,
                naming.stream_reader_network_policy(spec.name),
            )
        )
    if spec.backup is None:
        retired.append(reference("batch/v1", "CronJob", spec, naming.backup_cron_job(spec.name)))
    return retired


def reference(api_version: str, kind: str, spec: TopicSpec, name: str) -> Manifest:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": name, "namespace": spec.namespace},
    }


def configured_monitor(monitor: Manifest, settings: ServiceMonitorSettings) -> Manifest:
    """The topic's ServiceMonitor with the operator's labels and interval; the topic's own
    labels win a clash (the operator finds its children by them)."""
    metadata = monitor["metadata"]
    labels = {**dict(settings.labels), **metadata["labels"]}
    endpoints = [
        {**endpoint, "interval": settings.interval} for endpoint in monitor["spec"]["endpoints"]
    ]
    return {
        **monitor,
        "metadata": {**metadata, "labels": labels},
        "spec": {**monitor["spec"], "endpoints": endpoints},
    }


def render(
    owner: Mapping[str, Any],
    spec: TopicSpec,
    ctx: BuildContext,
    credentials: Credentials,
    slot_amount: int,
    with_service_monitor: bool,
) -> list[Manifest]:
    """build_all() with every child owned by the DelayTopic, so deleting it deletes them."""
    return adopted(owner, build_all(spec, ctx, credentials, slot_amount, with_service_monitor))


def adopted(owner: Mapping[str, Any], manifests: list[Manifest]) -> list[Manifest]:
    """The manifests owned by the DelayTopic `owner`: deleting it deletes them."""
    kopf.adopt(manifests, owner=kopf.Body(cast(kopf.RawBody, dict(owner))), strict=True)
    return manifests
