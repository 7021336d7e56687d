"""The cluster DNS of the real node: CoreDNS with its real ``kubernetes`` plugin, as a Deployment.

It runs as a pod on the real node rather than as a process on the host: then it reaches the API
server through the ``kubernetes`` Service like any in-cluster client, its ClusterIP is served by
kube-proxy, and Service names resolve exactly as on a real cluster (the image is built from the
Go module by e2e/build.sh and e2e/images.sh).
"""

from __future__ import annotations

from typing import Any

from e2e.harness.node import CLUSTER_DNS_IP, placement

NAMESPACE = "kube-system"
LABELS = {"k8s-app": "kube-dns"}
#: CoreDNS listens above 1024 (it runs as non-root without capabilities); the Service maps 53.
PORT = 1053

COREFILE = f""".:{PORT} {{
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
"""


def coredns_objects(image: str) -> list[dict[str, Any]]:
    """ServiceAccount, RBAC, Corefile, Deployment and the ``kube-dns`` Service."""
    meta = {"name": "coredns", "namespace": NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "delayq-e2e-coredns"},
         "rules": [
             {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
              "verbs": ["list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
              "verbs": ["list", "watch"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "delayq-e2e-coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "delayq-e2e-coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
         "data": {"Corefile": COREFILE}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {**meta, "labels": LABELS},
         "spec": {
             "replicas": 1,
             "selector": {"matchLabels": LABELS},
             "template": {
                 "metadata": {"labels": LABELS},
                 "spec": {
                     **placement(),
                     "serviceAccountName": "coredns",
                     "dnsPolicy": "Default",
                     "containers": [{
                         "name": "coredns",
                         "image": image,
                         "imagePullPolicy": "IfNotPresent",
                         "args": ["-conf", "/etc/coredns/Corefile"],
                         "ports": [{"name": "dns", "containerPort": PORT, "protocol": "UDP"},
                                   {"name": "dns-tcp", "containerPort": PORT,
                                    "protocol": "TCP"}],
                         "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181},
                                            "periodSeconds": 2},
                         "livenessProbe": {"httpGet": {"path": "/health", "port": 8080},
                                           "periodSeconds": 10},
                         "securityContext": {"allowPrivilegeEscalation": False,
                                             "readOnlyRootFilesystem": True,
                                             "runAsNonRoot": True,
                                             "capabilities": {"drop": ["ALL"]}},
                         "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                     }],
                     "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                 },
             },
         }},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": NAMESPACE, "labels": LABELS},
         "spec": {"clusterIP": CLUSTER_DNS_IP, "selector": LABELS,
                  "ports": [{"name": "dns", "port": 53, "targetPort": PORT, "protocol": "UDP"},
                            {"name": "dns-tcp", "port": 53, "targetPort": PORT,
                             "protocol": "TCP"}]}},
    ]
