"""Applying children: what counts as unchanged, and patches that leave immutable fields alone."""

from __future__ import annotations

from delayq.kube.apply import contains, update_patch


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
