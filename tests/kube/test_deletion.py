"""Deletion without a finalizer: which ZooKeeper trees are garbage (pure), and their collection
against kmock (the topics) and the real ZooKeeper (the trees)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence

import kmock
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from delayq.coordination.routing import Routing
from delayq.kube.context import OperatorContext
from delayq.kube.zk import KazooTopicStore, topic_root
from delayq.kube.zk_gc import collect_orphans, orphaned_trees
from tests.kube.conftest import DT
from tests.kube.pods import NAMESPACE

OTHER_NS = "elsewhere"  # a namespace the operator under test does not watch


# --- pure selection ---------------------------------------------------------------------------


def test_a_tree_without_its_topic_in_a_watched_namespace_is_garbage() -> None:
    trees = [("shop", "orders"), ("shop", "gone"), ("billing", "gone"), ("other", "gone")]
    topics = [("shop", "orders")]
    assert orphaned_trees(trees, topics, ["shop", "billing"]) == [
        ("billing", "gone"),
        ("shop", "gone"),
    ]


def test_cluster_wide_every_namespace_is_watched() -> None:
    assert orphaned_trees([("a", "x"), ("b", "y")], [("b", "y")], []) == [("a", "x")]


def test_a_topic_of_the_same_name_elsewhere_does_not_keep_a_tree() -> None:
    assert orphaned_trees([("shop", "orders")], [("billing", "orders")], []) == [("shop", "orders")]


# --- collection against real ZooKeeper ---------------------------------------------------------


def put_topic(api: kmock.KubernetesEmulator, name: str, namespace: str = NAMESPACE) -> None:
    api.objects[DT, namespace, name] = {
        "apiVersion": "delayq.io/v1alpha1",
        "kind": "DelayTopic",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {},
    }


def tree(zk: KazooClient, name: str, namespace: str = NAMESPACE, uid: str | None = None) -> str:
    """A topic's tree as publish leaves it: its UID marker (put_topic's UID by default) on the
    root; `uid=""` is a tree without one (an older operator's)."""
    path = topic_root(namespace, name)
    zk.ensure_path(f"{path}/owners")
    zk.set(path, (f"uid-{name}" if uid is None else uid).encode())
    return path


@pytest.fixture
def trees(zk_client: KazooClient, ctx: OperatorContext) -> Iterator[KazooClient]:
    """ZooKeeper with this module's trees removed first (and after); `ctx` allows the
    session's ensemble only (an unreachable one costs every collection its timeout)."""
    build = dataclasses.replace(ctx.build, zookeeper_allowed_ensembles=())
    ctx.config = dataclasses.replace(ctx.config, build=build)

    def clear() -> None:
        for namespace in (NAMESPACE, OTHER_NS):
            with contextlib.suppress(NoNodeError):
                zk_client.delete(f"/delayq/{namespace}", recursive=True)

    clear()
    yield zk_client
    clear()


async def test_trees_of_deleted_topics_in_watched_namespaces_are_removed(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, trees: KazooClient, logger: logging.Logger
) -> None:
    put_topic(api, "kept")
    kept, gone, foreign = tree(trees, "kept"), tree(trees, "gone"), tree(trees, "gone", OTHER_NS)
    assert await collect_orphans(ctx, [NAMESPACE], logger) == 1
    assert trees.exists(kept)
    assert not trees.exists(gone)
    assert trees.exists(foreign)  # never touched: that namespace is not watched


async def test_cluster_wide_collection_reads_every_namespace(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, trees: KazooClient, logger: logging.Logger
) -> None:
    put_topic(api, "kept")
    tree(trees, "kept")
    foreign = tree(trees, "gone", OTHER_NS)
    assert await collect_orphans(ctx, [], logger) >= 1
    assert not trees.exists(foreign)
    assert trees.exists(topic_root(NAMESPACE, "kept"))


async def test_a_topic_created_after_the_tree_listing_keeps_its_tree(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, trees: KazooClient, logger: logging.Logger
) -> None:
    """The trees are read first, the topics second: a topic created in between is listed."""
    path = tree(trees, "late")

    class CreatedInBetween(KazooTopicStore):
        async def topic_trees(
            self, connect: str, namespaces: Sequence[str]
        ) -> list[tuple[str, str]]:
            found = await super().topic_trees(connect, namespaces)
            put_topic(api, "late")  # its DelayTopic appears right after the tree listing
            return found

    store = CreatedInBetween(ctx.build.zookeeper_ensembles, timeout_s=2.0)
    try:
        late_deps = dataclasses.replace(ctx, store=store)
        assert await collect_orphans(late_deps, [NAMESPACE], logger) == 0
    finally:
        store.close()
    assert trees.exists(path)


async def test_every_platform_ensemble_is_collected_and_a_dead_one_is_only_logged(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    trees: KazooClient,
    dead_zookeeper: str,
    logger: logging.Logger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gone = tree(trees, "gone")
    build = dataclasses.replace(ctx.build, zookeeper_allowed_ensembles=(dead_zookeeper,))
    ctx.config = dataclasses.replace(ctx.config, build=build)  # allowed, not reachable
    assert await collect_orphans(ctx, [NAMESPACE], logger) == 1
    assert not trees.exists(gone)
    assert f"ZooKeeper {dead_zookeeper} unavailable for garbage collection" in caplog.text


async def test_a_tree_without_a_marker_of_a_deleted_topic_is_left_alone(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    trees: KazooClient,
    logger: logging.Logger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only a tree carrying a UID no DelayTopic has is removed: an unmarked one (an older
    operator's, or no topic's root at all) and one naming a live topic's UID are logged."""
    put_topic(api, "kept")
    unmarked = tree(trees, "old", uid="")
    foreign = tree(trees, "copied", uid="uid-kept")  # the marker of a topic that exists
    gone = tree(trees, "gone")
    assert await collect_orphans(ctx, [NAMESPACE], logger) == 1
    assert not trees.exists(gone)
    assert trees.exists(unmarked)
    assert trees.exists(foreign)
    assert f"{NAMESPACE}/old has no DelayTopic but no UID marker: left alone" in caplog.text
    assert "the UID of a live one (uid-kept)" in caplog.text


async def test_a_connect_without_the_platforms_chroot_never_wipes_the_tenants_trees(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    zk_client: KazooClient,
    zk_connect: str,
    logger: logging.Logger,
) -> None:
    """Issue 27, attack 3: the platform's ensemble is `zk/delayq` (a chroot, as recommended for
    a shared ensemble); a tenant names the same host without it. Read at the chroot-less
    root, the platform's `delayq/<namespace>` nodes looked like orphaned topics of a
    namespace `delayq`, and a cluster-wide collection removed every tenant's tree."""
    platform = dataclasses.replace(
        ctx.build, default_zookeeper=f"{zk_connect}/delayq", zookeeper_allowed_ensembles=()
    )
    ctx.config = dataclasses.replace(ctx.config, build=platform)
    store = KazooTopicStore(platform.zookeeper_ensembles, timeout_s=2.0)
    victims = [(NAMESPACE, "orders"), (OTHER_NS, "invoices")]
    try:
        attacked = dataclasses.replace(ctx, store=store)
        for namespace, name in victims:
            put_topic(api, name, namespace)
            await store.publish(
                f"{zk_connect}/delayq", namespace, name, Routing(4, 1, (0,) * 4), "", f"uid-{name}"
            )
        put_topic(api, "attacker")  # its tenant names the platform's host, no chroot
        api.objects[DT, NAMESPACE, "attacker"].patch(
            {"spec": {"zookeeper": {"connect": zk_connect}}}
        )
        assert await collect_orphans(attacked, [], logger) == 0
    finally:
        await asyncio.to_thread(store.close)
        for namespace, name in victims:
            path = f"/delayq{topic_root(namespace, name)}"
            assert zk_client.exists(path), f"{path} was removed"
        zk_client.delete("/delayq/delayq", recursive=True)
