"""Deletion without a finalizer: the cleanup owner references cannot do.

DelayTopics carry no finalizer. A finalizer needs a running operator to go away, so one left by
an operator that died without SIGTERM (kill -9, node loss) blocked the topic's deletion, and its
namespace's, until an operator ran again. Instead every part of a topic goes by itself:
- its children (StatefulSets, Services, Secret, ConfigMap, ...) through their owner references,
  collected by the Kubernetes garbage collector;
- its Redis volume claims through the StatefulSets' persistentVolumeClaimRetentionPolicy
  (`whenDeleted` = `spec.deletionPolicy`), applied by the StatefulSet controller;
- its ZooKeeper tree `/delayq/<ns>/<topic>` through `collect_orphans`, run by the leader's health
  loop: a tree whose DelayTopic no longer exists, in a namespace the operator watches, is removed
  (also after an operator was down while topics or whole namespaces were deleted).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from delayq.kube import naming
from delayq.kube.builders.common import Manifest
from delayq.kube.builders.service import zookeeper_connect
from delayq.kube.client import KubeApiError, KubeClient
from delayq.kube.handlers.deps import Deps, Logger
from delayq.kube.handlers.reconcile import TRANSIENT_ERRORS, parse_body
from delayq.kube.spec import SpecError

TOPIC_API_VERSION = f"{naming.GROUP}/{naming.VERSION}"
TopicKey = tuple[str, str]  # (namespace, name)


async def list_topics(kube: KubeClient, namespaces: Sequence[str]) -> list[Manifest]:
    """Every DelayTopic in `namespaces` (every namespace when empty)."""
    topics: list[Manifest] = []
    for namespace in namespaces or ("",):  # "": the cluster-wide listing
        topics += await kube.list(TOPIC_API_VERSION, naming.KIND, namespace, {})
    return topics


def topic_key(topic: Mapping[str, Any]) -> TopicKey:
    meta = topic["metadata"]
    return (str(meta["namespace"]), str(meta["name"]))


def orphaned_trees(
    trees: Iterable[TopicKey], topics: Iterable[TopicKey], watched: Sequence[str]
) -> list[TopicKey]:
    """The ZooKeeper trees to remove: no DelayTopic of that name, in a watched namespace.

    `trees` must have been read BEFORE `topics` was listed: a tree is only ever created for a
    topic that exists, so a topic created after the tree listing cannot be missed by the topic
    listing. An empty `watched` means every namespace (the cluster-wide operator).
    """
    existing = set(topics)
    return sorted(
        tree
        for tree in set(trees)
        if tree not in existing and (not watched or tree[0] in watched)
    )


def ensembles(deps: Deps, topics: Iterable[Mapping[str, Any]]) -> list[str]:
    """The operator's default ensemble and every ensemble a listed topic uses."""
    found = {deps.ctx.default_zookeeper}
    for topic in topics:
        try:
            found.add(zookeeper_connect(parse_body(topic), deps.ctx))
        except SpecError:
            continue  # reconcile reports it; its tree can only be on a known ensemble
    return sorted(found)


async def collect_orphans(
    deps: Deps, namespaces: Sequence[str], listed: Sequence[Mapping[str, Any]], logger: Logger
) -> int:
    """Remove the ZooKeeper trees of deleted topics; returns how many were removed.

    `listed` (a recent topic listing) only names the ensembles to look at. Per ensemble the
    trees are read first and the topics listed second (see orphaned_trees); each removal then
    re-checks, under the topic's lock, that the topic still does not exist, so a topic created
    meanwhile under the same name keeps its tree (its reconcile waits for the lock).
    """
    removed = 0
    for connect in ensembles(deps, listed):
        try:
            trees = await deps.store.topic_trees(connect, namespaces)
        except TRANSIENT_ERRORS as error:
            logger.warning("ZooKeeper %s unavailable for garbage collection: %r", connect, error)
            continue
        try:
            topics = [topic_key(topic) for topic in await list_topics(deps.kube, namespaces)]
            for namespace, name in orphaned_trees(trees, topics, namespaces):
                async with deps.lock(namespace, name):
                    if await deps.kube.get(TOPIC_API_VERSION, naming.KIND, namespace, name):
                        continue  # created again since the listing
                    await deps.store.delete(connect, namespace, name)
                logger.info("removed the ZooKeeper tree of deleted topic %s/%s", namespace, name)
                removed += 1
        except (KubeApiError, *TRANSIENT_ERRORS) as error:
            logger.warning("ZooKeeper garbage collection in %s interrupted: %r", connect, error)
    return removed
