"""What one topic may take of a shared ensemble: a closed root and a hard quota per topic tree.

Every topic identity has every permission on its own tree (coordination/acl.py), so without a
limit one tenant could fill the ensemble's memory (nodes and data live in every server's heap)
and stall every other tenant. ZooKeeper 3.7+ enforces quotas as hard limits when the server
runs with `enforceQuota=true` (the bundled chart and `delayq.local.zookeeper_server` set it): a
create or set that would pass the limit of its tree fails with `QuotaExceeded`. Without the
setting (an older or differently configured bring-your-own ensemble) the same quota is only
logged by the server.

A quota lives in the server's own tree: `/zookeeper/quota/<path>/zookeeper_limits` holds the
limits, `zookeeper_stats` the server's count (recomputed by the server when the stats node is
created). `/zookeeper/quota` is writable by anyone out of the box, which would let a tenant lift
its own quota: the operator closes it to everyone but itself, and writes every quota node with
its own ACL.

The ensemble's root `/` is world-writable out of the box: anyone reaching the ensemble could
create top-level nodes, and squat or fill what the platform has not created yet. The operator
makes it its own, readable by all (listing `/` shows `delayq` and `zookeeper` only);
`/zookeeper` keeps its own ACL.

A client in a chroot (`zk:2181/delayq`, a bring-your-own ensemble) can reach neither
`/zookeeper` nor the ensemble's root, and the chroot node is someone's choice: there the
operator changes nothing, and the ensemble's operators set the chroot node's ACL and a quota
(docs/security.md, "Operating the controls").
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NodeExistsError, NoNodeError
from kazoo.security import ACL, Id, Permissions

from delayq.coordination.acl import digest_acl
from delayq.coordination.layout import TopicPaths
from delayq.queue.topic import MAX_SLOT_AMOUNT

log = logging.getLogger(__name__)

QUOTA_ROOT = "/zookeeper/quota"
LIMITS_NODE = "zookeeper_limits"
STATS_NODE = "zookeeper_stats"


@dataclass(frozen=True)
class TreeQuota:
    """The hard limits of one topic's tree: nodes (the tree's root included) and data bytes.

    The default fits a topic at the largest slot amount with room to spare: per slot an
    `owners/<slot>` node (a member id, under 100 bytes), a `migrations/<slot>` record of a move
    under way (about 200 bytes) and a `movers/<slot>` lock, plus `assignment` and `routing`
    (tens of KB each at 16,384 slots), a few container nodes and one `members/` node per
    delay-service pod. All of them at once at 16,384 slots measured 49,159 nodes and 4.1 MB
    (tests/kube/test_zookeeper_quota.py), so 65,536 nodes and 16 MiB leave a factor of 1.3 on
    the count and 4 on the bytes, and cap what one topic puts in each server's heap at 16 MiB
    of data plus roughly 100 bytes per node (about 23 MiB).
    """

    count: int = 4 * MAX_SLOT_AMOUNT
    size_bytes: int = 16 * 1024 * 1024

    def limits(self) -> bytes:
        """The `zookeeper_limits` payload: hard limits only (`count`/`bytes` -1: no soft ones),
        in ZooKeeper's `StatsTrack` format, as `setquota -N -B` writes it."""
        fields = f"count=-1,bytes=-1,countHardLimit={self.count},byteHardLimit={self.size_bytes}"
        return fields.encode()


TOPIC_QUOTA = TreeQuota()


def root_acl(admin_acl_id: str) -> list[ACL]:
    """The connection's root: the operator's; anyone may list it."""
    return [digest_acl(admin_acl_id), ACL(Permissions.READ, Id("world", "anyone"))]


def guard_topic_tree(
    client: KazooClient, paths: TopicPaths, admin_acl_id: str, quota: TreeQuota = TOPIC_QUOTA
) -> None:
    """Close the ensemble's root and `/zookeeper/quota` to everyone but the operator and put
    `quota` on the topic's tree (idempotent: the operator calls it on every publish). Blocking,
    as every kazoo call; `client` is logged in as the operator.

    Nothing through a chroot: `/zookeeper` is out of its reach, and its root is a node someone
    chose, maybe inside another topic's tree (issue 27 pointed a chroot at a victim's
    `members/`: closing that root would lock the victim's services out of it). A root the
    operator may not change (its owner restricted it) is left as it is and logged once, as is
    a quota node someone else holds: the topic's own tree is protected by its ACLs either way,
    and refusing to publish would stall every topic for a limit that only its owner can lift.
    """
    if client.chroot:
        return
    try:
        _set_acl(client, "/", root_acl(admin_acl_id))
    except NoAuthError:
        _warn_once("ZooKeeper root /: the operator may not set its ACL")
    admin_only = [digest_acl(admin_acl_id)]
    try:
        _set_acl(client, QUOTA_ROOT, admin_only)
        node = quota_path(paths)
        parent = QUOTA_ROOT
        for name in node.removeprefix(QUOTA_ROOT + "/").split("/"):
            parent = f"{parent}/{name}"
            ensure_node(client, parent, admin_only)
        _put(client, f"{node}/{LIMITS_NODE}", quota.limits(), admin_only)
        # the server counts the tree when its stats node is created (not when it is set)
        with contextlib.suppress(NodeExistsError):
            client.create(f"{node}/{STATS_NODE}", b"count=0,bytes=0", acl=admin_only)
    except NoAuthError:
        _warn_once(f"ZooKeeper quota of {paths.root}: the operator may not set it")


@functools.cache
def _warn_once(message: str) -> None:
    """Log `message` the first time only (publishing repeats every reconcile)."""
    log.warning("%s: left as it is", message)


def drop_topic_quota(client: KazooClient, paths: TopicPaths) -> None:
    """Remove the quota of a deleted topic's tree (nothing when none or in a chroot)."""
    if client.chroot:
        return
    with contextlib.suppress(NoNodeError):
        client.delete(quota_path(paths), recursive=True)


def quota_path(paths: TopicPaths) -> str:
    """Where the server keeps the quota of the topic's tree."""
    return f"{QUOTA_ROOT}{paths.root}"


def _set_acl(client: KazooClient, path: str, acl: list[ACL]) -> None:
    if list(client.get_acls(path)[0]) != acl:
        client.set_acls(path, acl)


def ensure_node(client: KazooClient, path: str, acl: list[ACL]) -> None:
    """`path` exists with exactly `acl`; its parent must exist."""
    try:
        client.create(path, b"", acl=acl)
    except NodeExistsError:
        _set_acl(client, path, acl)


def _put(client: KazooClient, path: str, data: bytes, acl: list[ACL]) -> None:
    try:
        client.create(path, data, acl=acl)
        return
    except NodeExistsError:
        pass
    if client.get(path)[0] != data:
        client.set(path, data)
    _set_acl(client, path, acl)
