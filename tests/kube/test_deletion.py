"""Deletion without a finalizer: which ZooKeeper trees are garbage (pure), and their collection
against kmock (the topics) and the real ZooKeeper (the trees)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator, Sequence

import kmock
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

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


def tree(zk: KazooClient, name: str, namespace: str = NAMESPACE) -> str:
    path = topic_root(namespace, name)
    zk.ensure_path(f"{path}/owners")
    zk.set(path, b"")
    return path


@pytest.fixture
def trees(zk_client: KazooClient) -> Iterator[KazooClient]:
    """ZooKeeper with this module's trees removed first (and after)."""

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
    assert await collect_orphans(ctx, [NAMESPACE], [], logger) == 1
    assert trees.exists(kept)
    assert not trees.exists(gone)
    assert trees.exists(foreign)  # never touched: that namespace is not watched


async def test_cluster_wide_collection_reads_every_namespace(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, trees: KazooClient, logger: logging.Logger
) -> None:
    put_topic(api, "kept")
    tree(trees, "kept")
    foreign = tree(trees, "gone", OTHER_NS)
    assert await collect_orphans(ctx, [], [], logger) >= 1
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

    store = CreatedInBetween(timeout_s=2.0)
    try:
        late_deps = dataclasses.replace(ctx, store=store)
        assert await collect_orphans(late_deps, [NAMESPACE], [], logger) == 0
    finally:
        store.close()
    assert trees.exists(path)


async def test_every_ensemble_in_use_is_collected_and_a_dead_one_is_only_logged(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    trees: KazooClient,
    dead_zookeeper: str,
    logger: logging.Logger,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gone = tree(trees, "gone")
    elsewhere = {
        "metadata": {"name": "remote", "namespace": NAMESPACE},
        "spec": {"zookeeper": {"connect": dead_zookeeper}},
    }
    assert await collect_orphans(ctx, [NAMESPACE], [elsewhere], logger) == 1
    assert not trees.exists(gone)
    assert f"ZooKeeper {dead_zookeeper} unavailable for garbage collection" in caplog.text
