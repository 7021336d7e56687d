"""Applying children: what counts as unchanged, patches that leave immutable fields alone, and
deletes of retired children that touch only the topic's own object as it was read."""

from __future__ import annotations

import kmock

from delayq.kube.apply import contains, remove, update_patch
from delayq.kube.client import KubeClient


def test_contains_ignores_server_defaults_but_not_removals() -> None:
    existing = {"spec": {"a": 1, "list": [{"x": 1, "defaulted": True}], "extra": 2}}
    assert contains(existing, {"spec": {"a": 1, "list": [{"x": 1}]}})
    assert not contains(existing, {"spec": {"a": 2}})
    assert not contains(existing, {"spec": {"list": [{"x": 1}, {"x": 2}]}})


def test_update_patch_leaves_immutable_statefulset_fields_alone() -> None:
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "n", "namespace": "s", "labels": {"a": "b"}, "uid": "x"},
        "spec": {"replicas": 2, "selector": {}, "serviceName": "h", "volumeClaimTemplates": []},
    }
    patch = update_patch(manifest)
    assert patch["spec"] == {"replicas": 2}
    assert patch["metadata"] == {"labels": {"a": "b"}}
    assert "selector" in manifest["spec"]  # the input is not mutated


async def test_remove_deletes_only_the_owned_object_it_read(
    api: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    secrets = "v1/secrets"
    at = {"namespace": "shop"}
    meta = {"namespace": "shop", "uid": "secret-uid", "resourceVersion": "7"}
    owned = {"ownerReferences": [{"uid": "topic-uid", "kind": "DelayTopic"}]}
    api.objects[secrets, "shop", "ours"] = {"metadata": {**meta, "name": "ours", **owned}}
    api.objects[secrets, "shop", "theirs"] = {"metadata": {**meta, "name": "theirs"}}

    def reference(name: str) -> dict[str, object]:
        return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, **at}}

    assert await remove(kube, reference("theirs"), "topic-uid") == "unchanged"
    assert await remove(kube, reference("ours"), "other-topic") == "unchanged"
    assert await remove(kube, reference("absent"), "topic-uid") == "unchanged"
    assert [r.name for r in api if r.method.value == "DELETE"] == []
    assert await remove(kube, reference("ours"), "topic-uid") == "deleted"
    (delete,) = [r for r in api if r.method.value == "DELETE"]
    # a real API server refuses (409) the delete of an object replaced since it was read
    assert delete.data["preconditions"] == {"uid": "secret-uid", "resourceVersion": "7"}
    assert api.objects[secrets, "shop", "ours"].deleted
    assert not api.objects[secrets, "shop", "theirs"].deleted


def _merge(target: object, patch: object) -> object:
    """RFC 7386 JSON merge patch, as the API server applies the operator's patches."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


def test_a_broker_statefulset_stored_rolling_becomes_on_delete_without_rolling_fields() -> None:
    """0.1.0's broker StatefulSets rolled by themselves; the API server stored their strategy
    with its default `rollingUpdate: {partition: 0}`, which it refuses beside `OnDelete` (422
    `spec.updateStrategy.rollingUpdate: only allowed for updateStrategy 'RollingUpdate'`, seen
    on real pods by e2e/test_upgrade.py). The patch removes it, and once applied it is
    unchanged."""
    stored = {"spec": {"replicas": 2, "updateStrategy": {
        "type": "RollingUpdate", "rollingUpdate": {"partition": 0}}}}
    manifest = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "n", "namespace": "s"},
        "spec": {"replicas": 2, "updateStrategy": {"type": "OnDelete"}},
    }
    patch = update_patch(manifest)
    assert not contains(stored, patch)
    applied = _merge(stored, patch)
    assert isinstance(applied, dict)
    assert applied["spec"] == {"replicas": 2, "updateStrategy": {"type": "OnDelete"}}
    assert contains(applied, update_patch(manifest))
