"""Deletion: clean up what owner references cannot, and never hang the finalizer.

Children are owned by the DelayTopic, so Kubernetes garbage-collects them. What remains:
- the Redis volumes: with deletionPolicy Delete they are deleted here (and, independently of the
  operator, by the StatefulSets' persistentVolumeClaimRetentionPolicy); with Retain they stay;
- the topic's ZooKeeper tree.
Every failure is logged as a warning and the finalizer is released anyway: a stuck DelayTopic
would block its namespace's deletion, which is worse than a leftover ZooKeeper node.

Nothing can release a finalizer while no operator runs, so a stopping operator releases its own
(release_finalizers, from kopf's cleanup, after the watches ended): a topic deleted while no
operator runs (for instance with its namespace) goes at once, and owner references and the
StatefulSets' volume claim retention policy clean up after it; only its ZooKeeper tree is left.
A starting operator puts the finalizer back on every topic it handles (kopf does so on resume).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from delayq.kube import naming
from delayq.kube.builders.service import zookeeper_connect
from delayq.kube.client import KubeApiError, KubeClient
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


TOPIC_API_VERSION = f"{naming.GROUP}/{naming.VERSION}"
RELEASE_ATTEMPTS = 3


async def release_finalizers(
    kube: KubeClient, namespaces: Sequence[str], logger: Logger
) -> int:
    """Remove the operator's finalizer from every topic it watches; returns how many it released.

    Called when the operator stops. Best-effort: failures are logged, never raised. Each patch
    carries the resourceVersion it was computed from, so a concurrent change of the finalizer
    list is never overwritten (the topic is read again instead).
    """
    released = 0
    for namespace in namespaces or ("",):  # "": every namespace
        try:
            topics = await kube.list(TOPIC_API_VERSION, naming.KIND, namespace, {})
        except (KubeApiError, *TRANSIENT_ERRORS) as error:
            logger.warning("could not list topics to release their finalizers: %r", error)
            continue
        for topic in topics:
            released += await release_finalizer(kube, topic, logger)
    return released


async def release_finalizer(kube: KubeClient, topic: Mapping[str, Any], logger: Logger) -> int:
    meta = topic["metadata"]
    for _ in range(RELEASE_ATTEMPTS):
        finalizers = list(meta.get("finalizers") or [])
        if naming.FINALIZER not in finalizers:
            return 0
        rest = [item for item in finalizers if item != naming.FINALIZER]
        patch = {"metadata": {"finalizers": rest, "resourceVersion": meta["resourceVersion"]}}
        try:
            await kube.patch(TOPIC_API_VERSION, naming.KIND, meta["namespace"], meta["name"], patch)
            return 1
        except KubeApiError as error:
            if error.status == 404:
                return 0
            if error.status != 409:
                logger.warning("could not release the finalizer of %s: %r", meta["name"], error)
                return 0
        except TRANSIENT_ERRORS as error:
            logger.warning("could not release the finalizer of %s: %r", meta["name"], error)
            return 0
        try:
            fresh = await kube.get(TOPIC_API_VERSION, naming.KIND, meta["namespace"], meta["name"])
        except (KubeApiError, *TRANSIENT_ERRORS) as error:
            logger.warning("could not release the finalizer of %s: %r", meta["name"], error)
            return 0
        if fresh is None:
            return 0
        meta = fresh["metadata"]
    logger.warning("could not release the finalizer of %s: it kept changing", meta["name"])
    return 0
