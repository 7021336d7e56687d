"""etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK as local processes."""

from __future__ import annotations

import collections
import contextlib
import json
import secrets
import ssl
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from delayq.local.ports import free_port
from e2e.harness.kube import Kube, condition
from e2e.harness.kwok import (
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_VALUE,
    fake_node,
    storage_objects,
    volume_name,
)
from e2e.harness.netns import NodeNetwork
from e2e.harness.node import REAL_NODE
from e2e.harness.pki import make_pki, write_kubeconfig
from e2e.harness.process import (
    ManagedProcess,
    Tools,
    await_ready,
    http_ok,
    spawn,
    unverified_tls,
)


@dataclass
class LocalControlPlane:
    """etcd + kube-apiserver + controller-manager + scheduler + KWOK under one temp directory.

    The API server listens on the host end of the real node's veth pair (:mod:`netns`), made at
    start whether or not a real node joins later: that address is reachable from this machine
    only, by the tests and components on the host and by pods on the real node alike.
    """

    tools: Tools
    workdir: Path
    fake_nodes: int = 3
    processes: list[ManagedProcess] = field(default_factory=list)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    #: bearer tokens of the real node's kubelet (user ``system:node:<node>``, group
    #: ``system:nodes``: the Node authorizer's identity) and of its kube-proxy
    node_token: str = field(default_factory=lambda: secrets.token_hex(16))
    proxy_token: str = field(default_factory=lambda: secrets.token_hex(16))
    api_port: int = 0
    network: NodeNetwork | None = None

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig of this cluster."""
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        """The API server URL."""
        assert self.network is not None, "not started"
        return f"https://{self.network.host_ip}:{self.api_port}"

    def _spawn(self, name: str, argv: Sequence[str]) -> ManagedProcess:
        process = spawn(name, argv, self.workdir)
        self.processes.append(process)
        return process

    def _await(self, process: ManagedProcess, probe: Callable[[], Any], timeout: float) -> None:
        await_ready(process, probe, timeout)

    def start(self) -> None:
        """Start every component in dependency order, each awaited by its health endpoint."""
        self.network = NodeNetwork.create()
        pki = self.workdir / "pki"
        make_pki(pki, self.network.host_ip)
        (self.workdir / "tokens.csv").write_text(
            f"{self.token},admin,admin,system:masters\n"
            f"{self.node_token},system:node:{REAL_NODE},{REAL_NODE},system:nodes\n"
            f"{self.proxy_token},system:kube-proxy,kube-proxy\n"
        )

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
            f"--bind-address={self.network.host_ip}",
            f"--advertise-address={self.network.host_ip}",
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
            # the "kubernetes" Service points at the advertised address: the in-cluster operator
            # on the real node reaches the API server through it
            "--endpoint-reconciler-type=lease",
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
            "--kubelet-preferred-address-types=InternalIP",
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
            # one StatefulSet synced at a time: pods are created in the order their StatefulSets
            # were applied (the operator applies a topic's delay-service one before its Redis
            # ones, whose affinity looks for the service pods: test_placement.py). With the
            # default 5 workers a loaded machine created Redis pods first now and then.
            "--concurrent-statefulset-syncs=1",
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
        """Stop the components by PID in reverse start order (KWOK first, etcd last), then
        remove the node's network namespace."""
        for process in reversed(self.processes):
            process.stop()
        if self.network is not None:
            self.network.delete()


@contextlib.contextmanager
def local_control_plane(
    tools: Tools, workdir: Path, fake_nodes: int, volumes: int = 256
) -> Iterator[tuple[Kube, LocalControlPlane]]:
    """Start a :class:`LocalControlPlane`, register fake nodes and volumes, yield a client
    and the plane (the real node joins it through its network, server and tokens).

    The cluster counts as ready only when controller-manager has created the ``default``
    ServiceAccount (its token controller works, so pods are admitted) and every fake node is
    ``Ready`` (KWOK is heart-beating, so pods get scheduled and Running).
    """
    plane = LocalControlPlane(tools, workdir, fake_nodes)
    try:
        start = time.monotonic()
        plane.start()
        kube = Kube(plane.kubeconfig, tools, workdir / "client", abort=plane.first_crash)
        volume_root = workdir / "volumes"
        kube.create({"apiVersion": "v1", "kind": "List", "items": [
            *(fake_node(f"kwok-node-{index}") for index in range(fake_nodes)),
            *storage_objects(volumes, volume_root)]})
        for index in range(volumes):
            # world-writable: on the real node, pods of any uid (Redis 999, ZooKeeper 1000)
            # write to these host paths, which get no fsGroup ownership change
            directory = volume_root / volume_name(index)
            directory.mkdir(parents=True)
            directory.chmod(0o777)
        kube.wait(lambda: kube.get("serviceaccount", "default", "default"), timeout_s=90,
                  what="the default ServiceAccount (controller-manager working)")
        kube.wait(lambda: all(condition(node, "Ready") == "True"
                              for node in kube.items("nodes", selector="type=kwok")),
                  timeout_s=90, what="every KWOK node to be Ready")
        print(f"e2e: control plane up in {time.monotonic() - start:.1f}s at {plane.server}")
        yield kube, plane
        print(f"e2e: volume pool at the end: {volume_phases(kube)}")
    except BaseException:
        for process in plane.processes:
            print(f"--- {process.name} log tail ({process.log_path}):\n{process.tail()}")
        raise
    finally:
        plane.stop()


def volume_phases(kube: Kube) -> dict[str, int]:
    """How many of the pre-created volumes are in each phase (Available, Bound, Released): the
    pool is never recycled (``Retain``), so a suite that claims more than it holds leaves
    StatefulSet pods Pending on an unbound claim."""
    return dict(collections.Counter(
        volume.get("status", {}).get("phase", "?") for volume in kube.items("persistentvolumes")))
