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

Removing is the one ZooKeeper write that acts on what it finds rather than on a topic, so it
trusts nothing a tenant wrote. It looks only at the platform's ensembles (kube/ensembles.py),
each under the root the platform gave it: an ensemble taken from tenant specs, or the platform's
servers without the platform's chroot, showed other trees (`delayq/<ns>` as if it were a topic)
as orphans. And it removes only a tree carrying the UID marker that publish writes (the
DelayTopic's metadata.uid, kube/zk.py) when that UID is no topic's any more: a tree without one
(not a topic's root, or written by an older operator whose topic was deleted before a newer
operator published it again) is left alone and logged, for an administrator to remove.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from delayq.kube import naming
from delayq.kube.client import KubeApiError
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.errors import TRANSIENT_ERRORS
from delayq.kube.topics import API_VERSION, TopicKey, list_topics, topic_key


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


async def collect_orphans(
    ctx: OperatorContext, namespaces: Sequence[str], logger: Logger
) -> int:
    """Remove the ZooKeeper trees of deleted topics; returns how many were removed.

    Per platform ensemble the trees are read first and the topics listed second (see
    orphaned_trees); each removal then re-checks, under the topic's lock, that the topic still
    does not exist, so a topic created meanwhile under the same name keeps its tree (its
    reconcile waits for the lock), and reads the tree's marker there.
    """
    removed = 0
    for connect in ctx.build.zookeeper_ensembles:
        try:
            trees = await ctx.store.topic_trees(connect, namespaces)
        except TRANSIENT_ERRORS as error:
            logger.warning("ZooKeeper %s unavailable for garbage collection: %r", connect, error)
            continue
        try:
            listed = await list_topics(ctx.kube, namespaces)
            uids = {str((topic.get("metadata") or {}).get("uid") or "") for topic in listed}
            topics = [topic_key(topic) for topic in listed]
            for namespace, name in orphaned_trees(trees, topics, namespaces):
                async with ctx.lock(namespace, name):
                    if await ctx.kube.get(API_VERSION, naming.KIND, namespace, name):
                        continue  # created again since the listing
                    marker = await ctx.store.tree_uid(connect, namespace, name)
                    if not marker or marker in uids:
                        logger.warning(
                            "ZooKeeper %s: %s/%s has no DelayTopic but %s: left alone",
                            connect,
                            namespace,
                            name,
                            f"the UID of a live one ({marker})" if marker else "no UID marker",
                        )
                        continue
                    await ctx.store.delete(connect, namespace, name)
                logger.info("removed the ZooKeeper tree of deleted topic %s/%s", namespace, name)
                removed += 1
        except (KubeApiError, *TRANSIENT_ERRORS) as error:
            logger.warning("ZooKeeper garbage collection in %s interrupted: %r", connect, error)
    return removed
