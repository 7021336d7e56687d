"""Create-or-patch of one child manifest, touching only what the operator owns, and the delete
of a child the spec no longer renders.

Rules that keep updates safe on a real API server:
- Secrets in tenants' namespaces are written, never read (`write_secret`): the operator keeps
  its own copy of the values (kube/credentials.py), so it needs no `get` on Secrets there.
- StatefulSet fields the API server treats as immutable (selector, serviceName,
  volumeClaimTemplates) are sent on create only; a changed volume size is documented, not forced.
- A merge patch removes what the API server defaulted for an update strategy the manifest no
  longer uses (`rollingUpdate` beside `OnDelete`), which it would otherwise refuse.
- A child already containing every desired field is not patched at all (no write, no event).
- Only a child owned by the topic (an ownerReference to its uid) is ever deleted: an object of
  the same name that the tenant made stays.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from delayq.kube.builders.common import Manifest
from delayq.kube.client import KubeApiError, KubeClient

IMMUTABLE_SPEC_FIELDS = {"StatefulSet": ("selector", "serviceName", "volumeClaimTemplates")}


def contains(existing: Any, desired: Any) -> bool:
    """Whether `existing` holds every field of `desired`; server-side defaults are ignored.

    Lists must have the same length and contain each other element by element, so a defaulted
    field inside a container does not count as a difference but a removed container does.
    """
    if isinstance(desired, Mapping):
        return isinstance(existing, Mapping) and all(
            contains(existing.get(key), value) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(existing, list)
            and len(existing) == len(desired)
            and all(contains(old, new) for old, new in zip(existing, desired, strict=True))
        )
    return bool(existing == desired)


def update_patch(manifest: Manifest) -> Manifest:
    """The merge patch for an existing object: desired fields minus the immutable ones."""
    patch = {key: copy.deepcopy(value) for key, value in manifest.items() if key != "status"}
    patch["metadata"] = {
        key: manifest["metadata"][key]
        for key in ("labels", "annotations", "ownerReferences")
        if key in manifest["metadata"]
    }
    for field in IMMUTABLE_SPEC_FIELDS.get(manifest["kind"], ()):
        patch.get("spec", {}).pop(field, None)
    strategy = patch.get("spec", {}).get("updateStrategy")
    if strategy and strategy.get("type") == "OnDelete":
        # the API server stores `rollingUpdate: {partition: 0}` beside RollingUpdate (0.1.0's
        # brokers) and refuses it beside OnDelete: a merge patch of the type alone keeps it
        strategy["rollingUpdate"] = None
    return patch


async def ensure(
    kube: KubeClient,
    manifest: Manifest,
    before_create: Callable[[Manifest], Awaitable[None]] | None = None,
) -> str:
    """Make the child match `manifest`; returns "created", "patched" or "unchanged". A child
    that does not exist yet is created once `before_create` (when given) returned."""
    meta = manifest["metadata"]
    existing = await kube.get(
        manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"]
    )
    if existing is None:
        if before_create is not None:
            await before_create(manifest)
        await kube.create(manifest)
        return "created"
    patch = update_patch(manifest)
    if contains(existing, patch):
        return "unchanged"
    await kube.patch(
        manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"], patch
    )
    return "patched"


async def write_secret(
    kube: KubeClient, manifest: Manifest, kept_keys: frozenset[str] = frozenset()
) -> str:
    """Make a tenant's Secret hold the manifest's values without reading it: a merge patch of
    its keys (but `kept_keys`), labels and owner references; created whole when the patch finds
    no Secret. Returns "created" or "written" (a patch that may have changed nothing).

    So a tampered or removed key (but `kept_keys`) is written back at every reconcile, keys the
    operator does not write (`api-token-previous`) are left alone, and a deleted Secret is made
    again from the operator's copy: the pods that start next get the values the running ones
    hold.
    """
    meta = manifest["metadata"]
    where = (manifest["apiVersion"], manifest["kind"], meta["namespace"], meta["name"])
    data = {key: value for key, value in manifest["data"].items() if key not in kept_keys}
    owned = {key: meta[key] for key in ("labels", "ownerReferences") if key in meta}
    patch = {"metadata": owned, "data": data}
    for _ in range(2):  # a Secret created between our patch and our create: patched after all
        try:
            await kube.patch(*where, patch)
            return "written"
        except KubeApiError as error:
            if error.status != 404:
                raise
        try:
            await kube.create(manifest)
            return "created"
        except KubeApiError as error:
            if error.status != 409:
                raise
    raise KubeApiError(409, f"Secret {meta['namespace']}/{meta['name']} kept changing")


async def remove(kube: KubeClient, reference: Manifest, owner_uid: str) -> str:
    """Delete the child `reference` names (apiVersion, kind, metadata name and namespace) if
    the topic `owner_uid` owns it; returns "deleted" or "unchanged" (absent, or not ours: e.g.
    a Secret the tenant named `<t>-stream-reader` for its own `urlSecretRef`)."""
    meta = reference["metadata"]
    where = (reference["apiVersion"], reference["kind"], meta["namespace"], meta["name"])
    existing = await kube.get(*where)
    if existing is None or not owner_uid:
        return "unchanged"
    found = existing["metadata"]
    if not any(ref.get("uid") == owner_uid for ref in found.get("ownerReferences") or []):
        return "unchanged"
    seen = {key: found[key] for key in ("uid", "resourceVersion") if key in found}
    return "deleted" if await kube.delete(*where, preconditions=seen) else "unchanged"
