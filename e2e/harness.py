"""A local Kubernetes control plane for the e2e tier, run as plain processes on loopback.

There is no container engine on the machines this suite runs on, so instead of kind the harness
starts the real binaries built by ``e2e/build.sh``: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and KWOK (which plays the kubelet for fake nodes, so pods get scheduled and reach
``Running`` without running anything). Every server listens on a free 127.0.0.1 port, every file
lives in one temporary directory, readiness is awaited by condition with a deadline, and every
process is stopped by its PID.

``Kube`` is the thin client the tests use: it drives the same ``kubectl`` a user would, so a test
of "``kubectl apply`` of a bad spec fails with a clear message" asserts exactly what users see.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from delayq.local.ports import free_port
from delayq.local.waiting import wait_until

T = TypeVar("T")

#: Annotation KWOK selects its nodes by; also the value the fake nodes carry.
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"


class E2EError(RuntimeError):
    """A harness step failed; the message carries the relevant log tail."""


#: How e2e waits poll: the control plane converges over seconds, and a probe that raises
#: (connection refused, a kubectl error while the API is still coming up) only means "not yet".
INTERVAL_S = 0.25
NOT_YET: tuple[type[Exception], ...] = (Exception,)


def _http_ok(url: str, context: ssl.SSLContext | None = None, token: str | None = None) -> str:
    """GET ``url`` and return its body if the status is 200 (raises otherwise)."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=5, context=context) as response:
        body: str = response.read().decode()
        if response.status != 200:
            raise E2EError(f"{url}: HTTP {response.status}: {body[:200]}")
        return body or "ok"


def _unverified_tls() -> ssl.SSLContext:
    """TLS context for the health ports of controller-manager and scheduler.

    They serve with a self-signed certificate they generate in memory at start-up, so there is
    nothing to verify against; only ``/healthz`` (an always-allowed path) is read through it.
    """
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@dataclass
class ManagedProcess:
    """One server process of the control plane, with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        """The PID it is stopped by."""
        return self.popen.pid

    def exited(self) -> str | None:
        """If the process has died, say so with its log tail (for ``wait_until(abort=...)``)."""
        code = self.popen.poll()
        if code is None:
            return None
        return f"{self.name} (pid {self.pid}) exited with {code}:\n{self.tail()}"

    def tail(self, lines: int = 30) -> str:
        """The last lines of the log, which is where a failed start explains itself."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the PID, then SIGKILL it if it has not exited within ``grace`` seconds."""
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            self.popen.wait(timeout=grace)


def _openssl(*args: str, cwd: Path) -> None:
    """Run one ``openssl`` command in ``cwd``; its output only matters when it fails."""
    result = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise E2EError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def make_pki(directory: Path) -> None:
    """Create the cluster's throw-away PKI with the ``openssl`` CLI.

    * ``ca.crt``/``ca.key``: the cluster CA, so clients verify the API server for real and
      controller-manager can publish it (``--root-ca-file``) as ``kube-root-ca.crt``;
    * ``apiserver.crt``/``.key``: serving certificate for 127.0.0.1/localhost signed by that CA;
    * ``sa.key``/``sa.pub``: the service-account token signing pair, shared by the API server
      (sign and verify) and controller-manager (``--use-service-account-credentials``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\n"
    )
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
             "-out", "ca.crt", "-days", "2", "-subj", "/CN=delayq-e2e-ca", cwd=directory)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key",
             "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver", cwd=directory)
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "apiserver.crt", "-days", "2",
             "-extfile", "san.ext", cwd=directory)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)


def write_kubeconfig(path: Path, server: str, ca_file: Path, token: str) -> None:
    """Write an admin kubeconfig (bearer token, CA-verified) for the tests and the components."""
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


@dataclass
class Tools:
    """Where the binaries come from: the build cache, with kubectl/helm falling back to PATH."""

    bin_dir: Path | None

    def path(self, name: str) -> str:
        """Absolute path of a tool, preferring the pinned build over whatever is on PATH."""
        if self.bin_dir is not None and (self.bin_dir / name).exists():
            return str(self.bin_dir / name)
        found = shutil.which(name)
        if found is None:
            raise E2EError(f"{name} not found in {self.bin_dir} or on PATH (run e2e/build.sh)")
        return found


@dataclass
class LocalControlPlane:
    """etcd + kube-apiserver + controller-manager + scheduler + KWOK under one temp directory."""

    tools: Tools
    workdir: Path
    fake_nodes: int = 3
    processes: list[ManagedProcess] = field(default_factory=list)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    api_port: int = 0

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig of this cluster."""
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        """The API server URL."""
        return f"https://127.0.0.1:{self.api_port}"

    def _spawn(self, name: str, argv: Sequence[str]) -> ManagedProcess:
        log_path = self.workdir / "logs" / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.workdir, start_new_session=True,
            )
        process = ManagedProcess(name, popen, log_path)
        self.processes.append(process)
        return process

    def _await(self, process: ManagedProcess, probe: Callable[[], Any], timeout: float) -> None:
        start = time.monotonic()
        wait_until(probe, timeout, f"{process.name} to become ready",
                   interval_s=INTERVAL_S, not_yet=NOT_YET, abort=process.exited)
        print(f"e2e: {process.name} ready in {time.monotonic() - start:.1f}s (pid {process.pid})")

    def start(self) -> None:
        """Start every component in dependency order, each awaited by its health endpoint."""
        pki = self.workdir / "pki"
        make_pki(pki)
        (self.workdir / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")

        etcd_port, etcd_peer = free_port(), free_port()
        etcd = self._spawn("etcd", [
            self.tools.path("etcd"), "--name=e2e", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
            f"--initial-cluster=e2e=http://127.0.0.1:{etcd_peer}",
            "--unsafe-no-fsync=true",  # throw-away data: durability only costs time here
            "--log-level=warn",
        ])
        self._await(etcd, lambda: json.loads(
            _http_ok(f"http://127.0.0.1:{etcd_port}/health"))["health"] == "true", 60)

        self.api_port = free_port()
        apiserver = self._spawn("kube-apiserver", [
            self.tools.path("kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
            f"--secure-port={self.api_port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={self.workdir / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            # The "kubernetes" Service cannot point at a loopback address (Endpoints validation
            # forbids it) and nothing in this cluster needs it: the operator runs off-cluster.
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
        ])
        ca_context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self._await(apiserver, lambda: _http_ok(
            f"{self.server}/readyz", ca_context, self.token), 120)
        write_kubeconfig(self.kubeconfig, self.server, pki / "ca.crt", self.token)

        kcm_port = free_port()
        kcm = self._spawn("kube-controller-manager", [
            self.tools.path("kube-controller-manager"),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={kcm_port}",
            f"--cert-dir={self.workdir / 'kcm-certs'}",
            "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=true",
            # "*" = every default controller: garbagecollector, namespace, deployment,
            # replicaset, statefulset, serviceaccount(-token), nodelifecycle, endpoints, ...
            "--controllers=*",
        ])
        self._await(kcm, lambda: _http_ok(
            f"https://127.0.0.1:{kcm_port}/healthz", _unverified_tls()), 90)

        scheduler_port = free_port()
        scheduler = self._spawn("kube-scheduler", [
            self.tools.path("kube-scheduler"),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={scheduler_port}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}",
            "--leader-elect=false",
        ])
        self._await(scheduler, lambda: _http_ok(
            f"https://127.0.0.1:{scheduler_port}/healthz", _unverified_tls()), 90)

        kwok_port = free_port()
        kwok_config = self.workdir / "kwok.yaml"
        # An explicit (empty) configuration keeps a developer's ~/.kwok/kwok.yaml out of the run;
        # KWOK then uses its default node and pod stages (heartbeat with lease, pods Running).
        kwok_config.write_text(
            "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions: {}\n")
        kwok = self._spawn("kwok", [
            self.tools.path("kwok"), f"--config={kwok_config}",
            f"--kubeconfig={self.kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}={KWOK_NODE_VALUE}",
            f"--server-address=127.0.0.1:{kwok_port}",
            "--node-ip=127.0.0.1",
            "--cidr=10.244.0.0/16",
        ])
        self._await(kwok, lambda: _http_ok(f"http://127.0.0.1:{kwok_port}/healthz"), 60)

    def first_crash(self) -> str | None:
        """Report the first component that has died, if any (used to abort waits early)."""
        for process in self.processes:
            if (reason := process.exited()) is not None:
                return reason
        return None

    def stop(self) -> None:
        """Stop the components by PID in reverse start order (KWOK first, etcd last)."""
        for process in reversed(self.processes):
            process.stop()


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


def storage_objects(count: int, size: str = "20Gi") -> list[dict[str, Any]]:
    """A default StorageClass and a pool of ``count`` unbound PersistentVolumes.

    The local cluster has no volume provisioner, yet the chart's ZooKeeper and every topic's
    Redis StatefulSet claim volumes. controller-manager's PV binder binds each claim to one of
    these pre-created volumes (``Immediate`` binding), so StatefulSets behave as on a real
    cluster: the claim is Bound, the pod is scheduled. KWOK never mounts anything, so the host
    paths are never touched.
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
        "metadata": {"name": f"e2e-pv-{index:03d}", "labels": {"type": "kwok"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": f"/nonexistent/delayq-e2e/pv-{index:03d}"},
        },
    } for index in range(count)]
    return objects


class KubectlError(E2EError):
    """``kubectl`` exited non-zero; ``stderr`` holds the server's message (what users see)."""

    def __init__(self, argv: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(argv)} exited {returncode}: {stderr.strip()}")
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


@dataclass
class Kube:
    """Runs ``kubectl`` (and ``helm``) against one cluster, decoding JSON where asked."""

    kubeconfig: Path
    tools: Tools
    #: Private kubectl discovery cache and helm home: every local cluster has a new random port,
    #: which must not pile up entries in the user's ~/.kube/cache, and a stale cache must not
    #: hide a CRD that was just installed.
    state_dir: Path
    abort: Callable[[], str | None] | None = None

    def env(self) -> dict[str, str]:
        """Environment for child tools: this cluster's kubeconfig, helm state under state_dir."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        for var, sub in (("HELM_CACHE_HOME", "helm/cache"), ("HELM_CONFIG_HOME", "helm/config"),
                         ("HELM_DATA_HOME", "helm/data")):
            env[var] = str(self.state_dir / sub)
        return env

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl; raise :class:`KubectlError` on failure unless ``check`` is false."""
        argv = [f"--kubeconfig={self.kubeconfig}",
                f"--cache-dir={self.state_dir / 'kubectl-cache'}", *args]
        result = subprocess.run(
            [self.tools.path("kubectl"), *argv], input=input, capture_output=True, text=True,
            timeout=timeout, check=False,
        )
        if check and result.returncode != 0:
            raise KubectlError(args, result.returncode, result.stdout, result.stderr)
        return result

    def apply(self, obj: dict[str, Any] | str, namespace: str | None = None) -> str:
        """``kubectl apply -f -`` of a manifest (dict or YAML text); returns kubectl's output."""
        text = obj if isinstance(obj, str) else yaml.safe_dump(obj)
        args = ["apply", "-f", "-"] + (["-n", namespace] if namespace else [])
        return self.kubectl(*args, input=text).stdout

    def create(self, obj: dict[str, Any] | str, namespace: str | None = None) -> str:
        """``kubectl create -f -``: unlike apply it fails if the object already exists."""
        text = obj if isinstance(obj, str) else yaml.safe_dump(obj)
        args = ["create", "-f", "-"] + (["-n", namespace] if namespace else [])
        return self.kubectl(*args, input=text).stdout

    def get(self, kind: str, name: str | None = None,
            namespace: str | None = None) -> dict[str, Any] | None:
        """The object (or list) as JSON, or ``None`` when it does not exist."""
        args = ["get", kind] + ([name] if name else []) + ["-o", "json"]
        args += ["-n", namespace] if namespace else []
        result = self.kubectl(*args, check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise KubectlError(args, result.returncode, result.stdout, result.stderr)
        decoded: dict[str, Any] = json.loads(result.stdout)
        return decoded

    def items(self, kind: str, namespace: str | None = None,
              selector: str | None = None) -> list[dict[str, Any]]:
        """The items of a list, optionally filtered by a label selector."""
        args = ["get", kind, "-o", "json"] + (["-n", namespace] if namespace else [])
        args += ["-l", selector] if selector else []
        items: list[dict[str, Any]] = json.loads(self.kubectl(*args).stdout)["items"]
        return items

    def wait(self, condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
        """``delayq.local.waiting.wait_until`` at the e2e pace (exceptions mean "not yet"),
        aborted early if a control-plane component has crashed."""
        return wait_until(condition, timeout_s, what, interval_s=INTERVAL_S, not_yet=NOT_YET,
                          abort=self.abort)

    def helm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster; raise with its stderr on failure."""
        result = subprocess.run(
            [self.tools.path("helm"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True, text=True, timeout=timeout, check=False, env=self.env(),
        )
        if result.returncode != 0:
            raise E2EError(f"helm {' '.join(args)} exited {result.returncode}: "
                           f"{result.stderr.strip()}")
        return result


@dataclass(frozen=True)
class Release:
    """A ``helm install`` of charts/delayq: where it lives and what its objects are called."""

    name: str
    namespace: str
    fullname: str
    service_account: str


def condition(obj: dict[str, Any] | None, kind: str) -> str | None:
    """Status (``"True"``/``"False"``/``"Unknown"``) of condition ``kind`` of an object."""
    if not obj:
        return None
    for cond in obj.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == kind:
            status: str = cond.get("status")
            return status
    return None


@contextlib.contextmanager
def local_control_plane(
    tools: Tools, workdir: Path, fake_nodes: int, volumes: int = 64
) -> Iterator[Kube]:
    """Start a :class:`LocalControlPlane`, register fake nodes and volumes, yield a client.

    The cluster counts as ready only when controller-manager has created the ``default``
    ServiceAccount (its token controller works, so pods are admitted) and every fake node is
    ``Ready`` (KWOK is heart-beating, so pods get scheduled and Running).
    """
    plane = LocalControlPlane(tools, workdir, fake_nodes)
    try:
        start = time.monotonic()
        plane.start()
        kube = Kube(plane.kubeconfig, tools, workdir / "client", abort=plane.first_crash)
        kube.create({"apiVersion": "v1", "kind": "List", "items": [
            *(fake_node(f"kwok-node-{index}") for index in range(fake_nodes)),
            *storage_objects(volumes)]})
        kube.wait(lambda: kube.get("serviceaccount", "default", "default"), timeout_s=90,
                  what="the default ServiceAccount (controller-manager working)")
        kube.wait(lambda: all(condition(node, "Ready") == "True"
                              for node in kube.items("nodes", selector="type=kwok")),
                  timeout_s=90, what="every KWOK node to be Ready")
        print(f"e2e: control plane up in {time.monotonic() - start:.1f}s at {plane.server}")
        yield kube
    except BaseException:
        for process in plane.processes:
            print(f"--- {process.name} log tail ({process.log_path}):\n{process.tail()}")
        raise
    finally:
        plane.stop()


def service_account_kubeconfig(kube: Kube, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as a ServiceAccount with a freshly issued token.

    The local operator runs with exactly the chart's RBAC this way, so a missing permission
    fails the e2e test the same way it would fail in a cluster.
    """
    admin = yaml.safe_load(kube.kubeconfig.read_text())
    context = next(c["context"] for c in admin["contexts"]
                   if c["name"] == admin["current-context"])
    cluster = next(c["cluster"] for c in admin["clusters"] if c["name"] == context["cluster"])
    token = kube.kubectl("create", "token", account, "-n", namespace,
                         "--duration=6h").stdout.strip()
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": account,
                                                 "namespace": namespace}}],
        "current-context": "e2e",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


@dataclass
class LocalOperator:
    """``delayq operator`` as a local process: the documented test-only way to run it.

    Pods do not run under KWOK, so the operator Deployment the chart creates never executes;
    this process does its job against the same API server, with the chart's ServiceAccount
    token, watching only the given namespaces. It runs the checkout's code (``PYTHONPATH``), so
    a fresh clone tests itself rather than whatever ``delayq`` happens to be installed.
    """

    repo: Path
    kubeconfig: Path
    namespaces: Sequence[str]
    log_path: Path
    env_overrides: dict[str, str] = field(default_factory=dict)
    #: When set, run e2e/operator_main.py (the same operator plus the test-only Redis address
    #: map read from this JSON file) instead of the ``delayq operator`` command.
    addresses_file: Path | None = None
    #: False: campaign for the chart's leader Lease like a replica of the Deployment would.
    standalone: bool = True
    process: ManagedProcess | None = None

    def start(self) -> LocalOperator:
        """Start the operator and wait until its liveness endpoint answers."""
        port = free_port()
        env = dict(os.environ)
        env.update({
            "KUBECONFIG": str(self.kubeconfig),
            "PYTHONPATH": os.pathsep.join(
                [str(self.repo / "operator"), *filter(None, [env.get("PYTHONPATH")])]),
            "PYTHONUNBUFFERED": "1",
            **self.env_overrides,
        })
        # `delayq operator` leaves logging to its host (the container runtime collects
        # stderr); here the log file is the only witness of what it did, so turn it on.
        bootstrap = ("import logging, sys; logging.basicConfig(level=logging.INFO, "
                     "format='%(asctime)s %(levelname)s %(name)s: %(message)s'); "
                     "from delayq.cli import main; sys.exit(main())")
        argv = [sys.executable, "-c", bootstrap, "operator",
                *(["--standalone"] if self.standalone else []),
                f"--liveness=http://127.0.0.1:{port}/healthz"]
        if self.addresses_file is not None:
            argv = [sys.executable, str(self.repo / "e2e" / "operator_main.py"),
                    f"--addresses={self.addresses_file}",
                    f"--liveness=http://127.0.0.1:{port}/healthz"]
        for namespace in self.namespaces:
            argv += ["--namespace", namespace]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )
        self.process = ManagedProcess("delayq-operator", popen, self.log_path)
        wait_until(lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"), 60,
                   "the local operator's liveness endpoint", interval_s=INTERVAL_S,
                   not_yet=NOT_YET, abort=self.process.exited)
        return self

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to finish what it was doing."""
        if self.process is not None and self.process.popen.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.popen.wait(timeout=15)

    def stop(self) -> None:
        """Graceful stop by PID (SIGTERM, then SIGKILL after the grace period)."""
        if self.process is not None:
            self.process.stop(grace=20)

    def tail(self) -> str:
        """The operator's log tail, for failure messages."""
        return self.process.tail(60) if self.process is not None else "(not started)"

    @contextlib.contextmanager
    def running(self, kube: Kube, namespace: str) -> Iterator[LocalOperator]:
        """Run it for a fixture; at the end delete the namespace's DelayTopics while it still
        runs (so it collects their ZooKeeper trees; they carry no finalizer and would go
        without it too), then stop it and print its log tail."""
        self.start()
        try:
            yield self
        finally:
            kube.kubectl("delete", "dt", "--all", "-n", namespace, "--wait=false", check=False)
            try:
                kube.wait(lambda: not kube.items("dt", namespace), timeout_s=90,
                          what=f"the DelayTopics of {namespace} to be deleted")
            finally:
                print(f"--- local operator log tail ({self.log_path}):\n{self.tail()}")
                self.stop()
