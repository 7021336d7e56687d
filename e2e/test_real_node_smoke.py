"""Smoke: a pod really runs on the real node, resolves a Service and reaches the API server."""

from __future__ import annotations

from e2e.harness.kube import Kube
from e2e.harness.node import RealNode, placement


def test_a_pod_runs_and_resolves_the_api_service(kube: Kube, real_node: RealNode, namespace: str) -> None:
    image = real_node.images["delayq"].ref
    kube.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": namespace},
                "spec": {**placement(), "restartPolicy": "Never", "containers": [{
                    "name": "probe", "image": image, "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", "import socket,ssl,urllib.request;"
                                "print(socket.gethostbyname('kubernetes.default.svc.cluster.local'));"
                                "ctx=ssl.create_default_context(cafile='/var/run/secrets/kubernetes.io/serviceaccount/ca.crt');"
                                "print(urllib.request.urlopen('https://kubernetes.default.svc/healthz', context=ctx).read())"]}]}})
    kube.wait(lambda: (kube.get("pod", "probe", namespace) or {}).get("status", {}).get("phase") in ("Succeeded", "Failed"),
              timeout_s=120, what="the probe pod to finish")
    logs = kube.kubectl("logs", "probe", "-n", namespace).stdout
    print(logs)
    assert "10.96.0.1" in logs
