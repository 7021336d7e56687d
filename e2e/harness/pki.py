"""The local cluster's throw-away PKI and its admin kubeconfig (``openssl`` CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from e2e.harness.process import E2EError


def _openssl(*args: str, cwd: Path) -> None:
    """Run one ``openssl`` command in ``cwd``; its output only matters when it fails."""
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise E2EError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


#: The ``kubernetes`` Service's ClusterIP (the first address of the service range): pods reach
#: the API server by it, so the serving certificate names it.
KUBERNETES_SERVICE_IP = "10.96.0.1"


def make_pki(directory: Path, api_ip: str) -> None:
    """Create the cluster's throw-away PKI with the ``openssl`` CLI.

    * ``ca.crt``/``ca.key``: the cluster CA, so clients verify the API server for real and
      controller-manager can publish it (``--root-ca-file``) as ``kube-root-ca.crt``;
    * ``apiserver.crt``/``.key``: serving certificate signed by that CA for the address it
      listens on (``api_ip``), the ``kubernetes`` Service's ClusterIP and names, and loopback;
    * ``kubelet-client.crt``/``.key``: the API server's client certificate towards kubelets
      (logs, exec, port-forward), in ``system:masters`` so the kubelet's webhook authorizer
      allows it;
    * ``sa.key``/``sa.pub``: the service-account token signing pair, shared by the API server
      (sign and verify) and controller-manager (``--use-service-account-credentials``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "san.ext").write_text(
        f"subjectAltName=IP:{api_ip},IP:{KUBERNETES_SERVICE_IP},IP:127.0.0.1,DNS:localhost,"
        "DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\n"
    )
    (directory / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.crt", "-days", "2", "-subj", "/CN=delayq-e2e-ca", cwd=directory)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key",
             "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver", cwd=directory)
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "apiserver.crt", "-days", "2",
             "-extfile", "san.ext", cwd=directory)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "kubelet-client.key",
             "-out", "kubelet-client.csr",
             "-subj", "/O=system:masters/CN=kube-apiserver-kubelet-client", cwd=directory)
    _openssl("x509", "-req", "-in", "kubelet-client.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "kubelet-client.crt", "-days", "2",
             "-extfile", "client.ext", cwd=directory)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str) -> None:
    """Write a kubeconfig (bearer token, CA-verified): the admin's for the tests and the
    components, the node's and kube-proxy's for the real node."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {
            "server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
