"""Deletion: clean up what owner references cannot, and never hang the finalizer.

Children are owned by the DelayTopic, so Kubernetes garbage-collects them. What remains:
- the Redis volumes: with deletionPolicy Delete they are deleted here (and, independently of the
  operator, by the StatefulSets' persistentVolumeClaimRetentionPolicy); with Retain they stay;
- the topic's ZooKeeper tree.
Every failure is logged as a warning and the finalizer is released anyway: a stuck DelayTopic
would block its namespace's deletion, which is worse than a leftover ZooKeeper node.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from delayq.kube import naming
from delayq.kube.builders.service import zookeeper_connect
from delayq.kube.client import KubeApiError
from delayq.kube.handlers.deps import Deps, Logger
from delayq.kube.handlers.reconcile import TRANSIENT_ERRORS
from delayq.kube.spec import parse_spec


async def finalize(deps: Deps, body: Mapping[str, Any], logger: Logger) -> None:
    """Best-effort cleanup; always returns so kopf removes the finalizer."""
    meta = body.get("metadata") or {}
    name, namespace = meta["name"], meta["namespace"]
    raw_spec = body.get("spec") or {}
    if raw_spec.get("deletionPolicy", "Retain") == "Delete":
        await delete_volumes(deps, namespace, name, logger)
    else:
        logger.info("deletionPolicy Retain: keeping the Redis volumes of %s", name)
    try:
        connect = zookeeper_connect(parse_spec(name, namespace, raw_spec), deps.ctx)
    except ValueError:
        connect = deps.ctx.default_zookeeper
    try:
        await deps.store.delete(connect, namespace, name)
    except TRANSIENT_ERRORS as error:
        logger.warning(
            "could not remove /delayq/%s/%s from ZooKeeper (%r); releasing the finalizer anyway",
            namespace,
            name,
            error,
        )


async def delete_volumes(deps: Deps, namespace: str, name: str, logger: Logger) -> None:
    try:
        claims = await deps.kube.list(
            "v1", "PersistentVolumeClaim", namespace, naming.redis_selector(name)
        )
        for claim in claims:
            await deps.kube.delete(
                "v1", "PersistentVolumeClaim", namespace, claim["metadata"]["name"]
            )
            logger.info("deleted volume claim %s", claim["metadata"]["name"])
    except (KubeApiError, *TRANSIENT_ERRORS) as error:
        logger.warning("could not delete the volumes of %s (%r); releasing anyway", name, error)
