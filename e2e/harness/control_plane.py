"""etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK as local processes."""

from __future__ import annotations

import contextlib
import json
import secrets
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delayq.local.ports import free_port
from delayq.local.waiting import wait_until
from e2e.harness.kube import Kube, condition
from e2e.harness.kwok import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE, fake_node, storage_objects
from e2e.harness.pki import make_pki, write_kubeconfig
from e2e.harness.process import INTERVAL_S, NOT_YET, ManagedProcess, Tools, http_ok, unverified_tls


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
            http_ok(f"http://127.0.0.1:{etcd_port}/health"))["health"] == "true", 60)

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
        self._await(apiserver, lambda: http_ok(
            f"{self.server}/readyz", ca_context, self.token), 120)
        write_kubeconfig(self.kubeconfig, self.server, pki / "ca.crt", self.token)

        kcm_port = free_port()
        kcm = self._spawn("kube-controller-manager", [
            *self._controller_args("kube-controller-manager", kcm_port, "kcm-certs"),
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=true",
            # "*" = every default controller: garbagecollector, namespace, deployment,
            # replicaset, statefulset, serviceaccount(-token), nodelifecycle, endpoints, ...
            "--controllers=*",
        ])
        self._await(kcm, lambda: http_ok(
            f"https://127.0.0.1:{kcm_port}/healthz", unverified_tls()), 90)

        scheduler_port = free_port()
        scheduler = self._spawn(
            "kube-scheduler",
            self._controller_args("kube-scheduler", scheduler_port, "scheduler-certs"))
        self._await(scheduler, lambda: http_ok(
            f"https://127.0.0.1:{scheduler_port}/healthz", unverified_tls()), 90)

        kwok_port = free_port()
        kwok_config = self.workdir / "kwok.yaml"
        # An explicit (empty) configuration keeps a developer's ~/.kwok/kwok.yaml out of the run;
        # KWOK then uses its default node and pod stages (pods Running). The node lease must be
        # asked for: without it KWOK heart-beats through the node status only every ~55 s,
        # past controller-manager's 50 s node-monitor grace, so every node flapped NotReady
        # for a few seconds each minute; the node lifecycle controller then set every pod's
        # Ready=False, and with no kubelet nothing ever set it back (a Redis pod that can never
        # be promoted: the failover test failed whenever it ran a minute into the session).
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
            "--node-lease-duration-seconds=40",  # renewed every 10 s: the node heartbeat
        ])
        self._await(kwok, lambda: http_ok(f"http://127.0.0.1:{kwok_port}/healthz"), 60)

    def _controller_args(self, binary: str, port: int, certs: str) -> list[str]:
        """The command line controller-manager and scheduler share: the cluster's kubeconfig for
        everything, a loopback secure port with its own certificates, no leader election."""
        return [
            self.tools.path(binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={self.workdir / certs}",
            "--leader-elect=false",
        ]

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
