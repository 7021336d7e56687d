"""``delayq operator`` run as a local process against the e2e cluster."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from delayq.local.ports import free_port
from delayq.local.waiting import wait_until
from delayq.local.zookeeper_server import ZooKeeperServer
from e2e.harness.kube import Kube, Release, service_account_kubeconfig
from e2e.harness.metrics import samples
from e2e.harness.process import INTERVAL_S, NOT_YET, ManagedProcess, http_ok

#: The chart's leader Lease (its Role allows exactly this name) and the LeaderLeaseTiming defaults.
LEASE_NAME = "delayq-operator"
LEASE_DURATION_S = 15
RETRY_INTERVAL_S = 2


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
    #: The port of its /metrics (a free one per process: replicas run side by side here).
    metrics_port: int = 0

    def start(self) -> LocalOperator:
        """Start the operator and wait until its liveness endpoint answers."""
        port = free_port()
        self.metrics_port = free_port()
        metrics = f"--metrics=http://127.0.0.1:{self.metrics_port}/metrics"
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
                f"--liveness=http://127.0.0.1:{port}/healthz", metrics]
        if self.addresses_file is not None:
            argv = [sys.executable, str(self.repo / "e2e" / "operator_main.py"),
                    f"--addresses={self.addresses_file}",
                    f"--liveness=http://127.0.0.1:{port}/healthz", metrics]
        for namespace in self.namespaces:
            argv += ["--namespace", namespace]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )
        self.process = ManagedProcess("delayq-operator", popen, self.log_path)
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), 60,
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

    def metric(self, name: str, labels: dict[str, str]) -> float | None:
        """The sample ``name`` with exactly ``labels`` of its /metrics, or None."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return next((value for found, value in samples(text, name) if found == labels), None)

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


def chart_env(kube: Kube, chart_release: Release, zookeeper: ZooKeeperServer) -> dict[str, str]:
    """What the chart's operator Deployment gives its container, with the local ZooKeeper: the
    release namespace and the ZooKeeper admin password from the chart's Secret (so every topic
    tree gets its ACLs, as in a real install). The platform lets topics opt out of the SSRF
    guard (`tenantPolicy.allowPrivateTargets`): the tests' webhook receivers are on loopback."""
    secret = kube.get("secret", f"{chart_release.fullname}-zookeeper-admin",
                      chart_release.namespace)
    assert secret is not None, "the chart's ZooKeeper admin Secret"
    return {"DELAYQ_ZOOKEEPER": zookeeper.hosts, "POD_NAMESPACE": chart_release.namespace,
            "DELAYQ_ZOOKEEPER_ADMIN_PASSWORD":
                base64.b64decode(secret["data"]["admin-password"]).decode(),
            "DELAYQ_TENANT_ALLOW_PRIVATE_TARGETS": "true"}


def chart_kubeconfig(kube: Kube, chart_release: Release, workdir: Path,
                     namespace: str) -> Path:
    """A kubeconfig with the chart's ServiceAccount token (the operator's RBAC, exactly), once
    its grants are in effect for `namespace`: kopf discovers its resources once at start-up, and
    if the freshly installed RBAC has not yet reached the API server's authorizer cache, it
    would start blind."""
    kubeconfig = service_account_kubeconfig(
        kube, chart_release.namespace, chart_release.service_account, workdir / "kubeconfig")
    as_operator = Kube(kubeconfig, kube.tools, workdir / "client")
    grants = [("list", "customresourcedefinitions.apiextensions.k8s.io", None),
              ("watch", "delaytopics.delayq.io", namespace),
              ("patch", "delaytopics.delayq.io/status", namespace),
              ("create", "services", namespace),
              ("get", "secrets", chart_release.namespace)]  # its copies of the credentials
    kube.wait(lambda: all(
        as_operator.kubectl("auth", "can-i", verb, resource,
                            *(["-n", ns] if ns else []), check=False).stdout.strip() == "yes"
        for verb, resource, ns in grants),
        timeout_s=60, what="the chart's RBAC to be in effect for the operator's token")
    return kubeconfig


def tenant_namespace(kube: Kube, chart_release: Release, namespace: str) -> None:
    """Create `namespace` and install delayq for tenants there as a platform team does with the
    chart's default (cluster-wide, no StatefulSet writes anywhere): a RoleBinding to the
    ClusterRole `<fullname>-workloads` for the operator's ServiceAccount (docs/operator.md,
    "RBAC"), waited for until the API server's authorizer grants it."""
    kube.kubectl("create", "namespace", namespace)
    workloads = f"{chart_release.fullname}-workloads"
    account = f"{chart_release.namespace}:{chart_release.service_account}"
    kube.kubectl("create", "rolebinding", workloads, "-n", namespace,
                 f"--clusterrole={workloads}", f"--serviceaccount={account}")
    subject = f"system:serviceaccount:{account}"
    kube.wait(lambda: kube.kubectl("auth", "can-i", "create", "statefulsets.apps", "-n", namespace,
                                   f"--as={subject}", check=False).stdout.strip() == "yes",
              timeout_s=60, what=f"StatefulSet writes granted in {namespace}")


def lease_holder(kube: Kube, namespace: str) -> str:
    """The leader Lease's holder, ``<pod>_<random>`` ("" while nobody holds it)."""
    lease = kube.get("lease", LEASE_NAME, namespace)
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")
