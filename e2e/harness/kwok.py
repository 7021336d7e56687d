"""What KWOK and controller-manager need to play a cluster: fake nodes and pre-created volumes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Annotation KWOK selects its nodes by; also the value the fake nodes carry.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"

def fake_node(name: str) -> dict[str, Any]:
    """A Node object KWOK will manage: it keeps it Ready and runs its pods (in pretence).

    The status is given at create time because no kubelet will ever report capacity; the
    scheduler needs allocatable resources to place pods.
    """
    resources = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE,
                            "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", "type": "kwok",
                       "node-role.kubernetes.io/agent": ""},
        },
        "spec": {},
        "status": {
            "allocatable": resources,
            "capacity": resources,
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                         "kubeletVersion": "fake", "kubeProxyVersion": "fake",
                         "containerRuntimeVersion": "fake", "kernelVersion": "fake",
                         "osImage": "fake", "bootID": "", "machineID": "",
                         "systemUUID": ""},
        },
    }


#: StorageClass of the local cluster's pre-created volumes (the default class).
STORAGE_CLASS = "e2e-local"


def volume_name(index: int) -> str:
    """Name of the ``index``-th pre-created PersistentVolume (and of its host directory)."""
    return f"e2e-pv-{index:03d}"


def storage_objects(count: int, root: Path, size: str = "20Gi") -> list[dict[str, Any]]:
    """A default StorageClass and a pool of ``count`` unbound PersistentVolumes.

    The local cluster has no volume provisioner, yet the chart's ZooKeeper and every topic's
    Redis StatefulSet claim volumes. controller-manager's PV binder binds each claim to one of
    these pre-created volumes (``Immediate`` binding), so StatefulSets behave as on a real
    cluster: the claim is Bound, the pod is scheduled. Each volume is a host directory under
    ``root`` (the caller creates them): KWOK never mounts anything, the real node's kubelet
    mounts them into its pods.
    """
    objects: list[dict[str, Any]] = [{
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "annotations": {
            "storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "Immediate",
        "reclaimPolicy": "Retain",
    }]
    objects += [{
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": volume_name(index), "labels": {"type": "kwok"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": str(root / volume_name(index))},
        },
    } for index in range(count)]
    return objects
