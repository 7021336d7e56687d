"""The DelayTopic object as the operator reads and writes it: address, listing, spec, status patch.

The one definition of the topic's apiVersion and of its (namespace, name) key, shared by the
kopf wrapper (operator.py), the health loop and the ZooKeeper garbage collection.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from typing import Any

from delayq.kube import naming
from delayq.kube.builders.common import Manifest
from delayq.kube.client import KubeClient
from delayq.kube.context import OperatorContext
from delayq.kube.spec import TopicSpec, parse_spec
from delayq.kube.status import Condition, merge_conditions, status_patch

API_VERSION = f"{naming.GROUP}/{naming.VERSION}"
TopicKey = tuple[str, str]  # (namespace, name)


def topic_key(topic: Mapping[str, Any]) -> TopicKey:
    meta = topic["metadata"]
    return (str(meta["namespace"]), str(meta["name"]))


async def list_topics(kube: KubeClient, namespaces: Sequence[str]) -> list[Manifest]:
    """Every DelayTopic in `namespaces` (every namespace when empty)."""
    topics: list[Manifest] = []
    for namespace in namespaces or ("",):  # "": the cluster-wide listing
        topics += await kube.list(API_VERSION, naming.KIND, namespace, {})
    return topics


def parse_body(body: Mapping[str, Any]) -> TopicSpec:
    meta = body.get("metadata") or {}
    return parse_spec(meta["name"], meta["namespace"], body.get("spec") or {})


def now_iso(ctx: OperatorContext) -> str:
    moment = datetime.datetime.fromtimestamp(ctx.clock(), tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def with_conditions(
    ctx: OperatorContext, body: Mapping[str, Any], updates: list[Condition], **fields: Any
) -> dict[str, Any]:
    """The status patch: old status + new fields + merged conditions, diffed against old."""
    old = dict(body.get("status") or {})
    generation = (body.get("metadata") or {}).get("generation")
    new = {**old, **fields}
    new["conditions"] = merge_conditions(
        old.get("conditions") or [], updates, now_iso(ctx), generation
    )
    return status_patch(old, new)
