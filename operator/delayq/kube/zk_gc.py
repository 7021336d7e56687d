"""ZooKeeper garbage collection, the part of deleting a topic that owner references cannot do.

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
from delayq.kube.builders.service import zookeeper_connect
from delayq.kube.client import KubeApiError
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.errors import TRANSIENT_ERRORS
from delayq.kube.spec import SpecError
from delayq.kube.topics import API_VERSION, TopicKey, list_topics, parse_body, topic_key


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
        tree for tree in set(trees) if tree not in existing and (not watched or tree[0] in watched)
    )


def ensembles(ctx: OperatorContext, topics: Iterable[Mapping[str, Any]]) -> list[str]:
    """The operator's default ensemble and every ensemble a listed topic uses."""
    found = {ctx.build.default_zookeeper}
    for topic in topics:
        try:
            found.add(zookeeper_connect(parse_body(topic), ctx.build))
        except SpecError:
            continue  # reconcile reports it; its tree can only be on a known ensemble
    return sorted(found)


async def collect_orphans(
    ctx: OperatorContext,
    namespaces: Sequence[str],
    listed: Sequence[Mapping[str, Any]],
    logger: Logger,
) -> int:
    """Remove the ZooKeeper trees of deleted topics; returns how many were removed.

    `listed` (a recent topic listing) only names the ensembles to look at. Per ensemble the
    trees are read first and the topics listed second (see orphaned_trees); each removal then
    re-checks, under the topic's lock, that the topic still does not exist, so a topic created
    meanwhile under the same name keeps its tree (its reconcile waits for the lock).
    """
    removed = 0
    for connect in ensembles(ctx, listed):
        try:
            trees = await ctx.store.topic_trees(connect, namespaces)
        except TRANSIENT_ERRORS as error:
            logger.warning("ZooKeeper %s unavailable for garbage collection: %r", connect, error)
            continue
        try:
            topics = [topic_key(topic) for topic in await list_topics(ctx.kube, namespaces)]
            for namespace, name in orphaned_trees(trees, topics, namespaces):
                async with ctx.lock(namespace, name):
                    if await ctx.kube.get(API_VERSION, naming.KIND, namespace, name):
                        continue  # created again since the listing
                    await ctx.store.delete(connect, namespace, name)
                logger.info("removed the ZooKeeper tree of deleted topic %s/%s", namespace, name)
                removed += 1
        except (KubeApiError, *TRANSIENT_ERRORS) as error:
            logger.warning("ZooKeeper garbage collection in %s interrupted: %r", connect, error)
    return removed
