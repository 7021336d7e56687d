"""Fixtures of the e2e tier: one Kubernetes cluster per session, one namespace per test, and
what the KWOK-based tests share: the operator run locally with the chart's token, and a
webhook receiver on loopback.

By default the session starts a local control plane (``e2e.harness``) from the binaries that
``e2e/build.sh`` caches. With ``E2E_KUBECONFIG`` set, the same tests run against that existing
cluster instead (kind, a real cluster) and nothing is started or built.

In CI (``CI=true``) a skipped e2e test is reported as a failure: a tier that silently skips
proves nothing, and the design requires that a skip in CI is a failure.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from delayq.local.zookeeper_server import ZooKeeperServer
from e2e.harness import cluster_dns, receiver
from e2e.harness.control_plane import LocalControlPlane, local_control_plane
from e2e.harness.kube import Kube, Release
from e2e.harness.node import Image, RealNode, load_images, machine_lock
from e2e.harness.operator import LocalOperator, chart_env, chart_kubeconfig, tenant_namespace
from e2e.harness.process import REPO, Tools

CHART = REPO / "charts" / "delayq"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _bin_dir() -> Path | None:
    """The pinned tool directory: ``E2E_BIN_DIR``, else whatever ``e2e/build.sh`` reports.

    The build runs here, at session start, rather than inside a fixture so that a cold build
    (tens of minutes) is not cut short by the per-test timeout; a warm run returns at once.
    """
    if explicit := os.environ.get("E2E_BIN_DIR"):
        return Path(explicit)
    start = time.monotonic()
    result = subprocess.run(
        ["bash", str(REPO / "e2e" / "build.sh")], stdout=subprocess.PIPE, text=True, check=False
    )
    if result.returncode != 0:
        raise pytest.UsageError("e2e/build.sh failed; see its output above")
    print(f"e2e: tools ready in {time.monotonic() - start:.1f}s")
    return Path(result.stdout.strip().splitlines()[-1])


def _images(bin_dir: Path) -> dict[str, Image]:
    """The real node's images, built (or found in the cache) by ``e2e/images.sh``."""
    start = time.monotonic()
    result = subprocess.run(["bash", str(REPO / "e2e" / "images.sh"), str(bin_dir)],
                            stdout=subprocess.PIPE, text=True, check=False)
    if result.returncode != 0:
        raise pytest.UsageError("e2e/images.sh failed; see its output above")
    print(f"e2e: images ready in {time.monotonic() - start:.1f}s")
    return load_images(result.stdout.strip().splitlines()[-1])


_TOOLS: Tools | None = None
_IMAGES: dict[str, Image] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Build or locate the tools and images once per session (only for a local cluster)."""
    global _TOOLS
    if os.environ.get("E2E_KUBECONFIG"):
        _TOOLS = Tools(Path(os.environ["E2E_BIN_DIR"]) if os.environ.get("E2E_BIN_DIR") else None)
    else:
        bin_dir = _bin_dir()
        _TOOLS = Tools(bin_dir)
        if bin_dir is not None:
            _IMAGES.update(_images(bin_dir))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """In CI, turn every skip (but not an expected failure) into a failure."""
    report = yield
    if _in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, which counts as a failure for e2e: {reason}"
    return report


@pytest.fixture(scope="session")
def tools() -> Tools:
    """Paths of kubectl, helm and the control-plane binaries."""
    assert _TOOLS is not None, "pytest_sessionstart did not run"
    return _TOOLS


@pytest.fixture(scope="session")
def local_cluster() -> bool:
    """True when this session started its own control plane (KWOK nodes, local operator)."""
    return not os.environ.get("E2E_KUBECONFIG")


@pytest.fixture(scope="session")
def session_dir() -> Iterator[Path]:
    """The session's temporary directory (kubeconfig, logs, PKI, the real node's state),
    removed afterwards unless ``E2E_KEEP=1`` (then it stays for inspection)."""
    workdir = Path(tempfile.mkdtemp(prefix="delayq-e2e-"))
    print(f"e2e: session directory {workdir}")
    yield workdir
    if os.environ.get("E2E_KEEP") != "1":
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(
    tools: Tools, local_cluster: bool, session_dir: Path
) -> Iterator[tuple[Kube, LocalControlPlane | None]]:
    """The session's cluster: started here unless ``E2E_KUBECONFIG`` names one."""
    if not local_cluster:
        yield Kube(Path(os.environ["E2E_KUBECONFIG"]), tools, session_dir / "client"), None
    else:
        nodes = int(os.environ.get("E2E_FAKE_NODES", "3"))
        with local_control_plane(tools, session_dir, fake_nodes=nodes) as (client, plane):
            yield client, plane


@pytest.fixture(scope="session")
def kube(cluster: tuple[Kube, LocalControlPlane | None]) -> Kube:
    """A client for the session's cluster."""
    return cluster[0]


@pytest.fixture(scope="session")
def real_node(
    cluster: tuple[Kube, LocalControlPlane | None], tools: Tools, session_dir: Path
) -> Iterator[RealNode]:
    """The real node of the local cluster (containerd, kubelet, kube-proxy, CoreDNS), joined
    on first use: KWOK-only sessions never pay for it. Tests place pods on it with
    ``e2e.harness.node.placement()``; everything else keeps landing on KWOK nodes."""
    kube, plane = cluster
    if plane is None or plane.network is None:
        pytest.skip("real pods need the local cluster's real node (E2E_KUBECONFIG is set)")
    with machine_lock(timeout_s=1200):
        node = RealNode(tools, session_dir / "node", plane.network, plane.server,
                        session_dir / "pki" / "ca.crt", plane.node_token, plane.proxy_token,
                        dict(_IMAGES))
        try:
            start = time.monotonic()
            node.start(kube)
            kube.apply({"apiVersion": "v1", "kind": "List",
                        "items": cluster_dns.coredns_objects(_IMAGES["coredns"].ref)})
            kube.wait(lambda: (kube.get("deployment", "coredns", cluster_dns.NAMESPACE) or {})
                      .get("status", {}).get("readyReplicas") == 1,
                      timeout_s=120, what="the cluster DNS (CoreDNS) to be ready")
            print(f"e2e: real node and cluster DNS up in {time.monotonic() - start:.1f}s")
            yield node
        except BaseException:
            for process in node.processes:
                print(f"--- {process.name} log tail ({process.log_path}):\n{process.tail()}")
            raise
        finally:
            node.stop(kube)


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, deleted (without waiting) afterwards.

    The name carries the test's name so that leftovers on a shared cluster are attributable.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"e2e-{slug}-{secrets.token_hex(3)}"
    kube.kubectl("create", "namespace", name)
    kube.wait(lambda: kube.get("serviceaccount", "default", name), timeout_s=60,
              what=f"the default ServiceAccount in {name}")
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture(scope="session")
def chart_release(kube: Kube) -> Iterator[Release]:
    """``helm install --wait`` of charts/delayq as shipped (default values), once per session.

    ``--wait`` only returns when the operator Deployment and the bundled ZooKeeper StatefulSet
    are ready and its claim is Bound: on the local cluster KWOK reports the pods Running (they
    do not really run) and the claim binds to the harness's pre-created volumes. The release is
    uninstalled at the end; the CRDs stay (helm never deletes CRDs).
    """
    name = "delayq"
    namespace = f"e2e-delayq-system-{secrets.token_hex(3)}"
    start = time.monotonic()
    # E2E_HELM_ARGS adds install flags, e.g. "--set image.repository=kind.local/delayq" for a
    # cluster whose nodes really pull and run the operator image.
    extra = shlex.split(os.environ.get("E2E_HELM_ARGS", ""))
    kube.helm("install", name, str(CHART), "--namespace", namespace, "--create-namespace",
              "--wait", "--timeout", "5m", *extra)
    print(f"e2e: helm install took {time.monotonic() - start:.1f}s")
    # The chart names everything after the release, or "<release>-delayq" (see _helpers.tpl).
    fullname = name if "delayq" in name else f"{name}-delayq"
    yield Release(name, namespace, fullname, service_account=fullname)
    kube.helm("uninstall", name, "--namespace", namespace, "--wait", "--timeout", "3m")
    kube.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")


@pytest.fixture(scope="module")
def zookeeper() -> Iterator[ZooKeeperServer]:
    """A real standalone ZooKeeper on a free loopback port, for the locally run operator's
    routing tables (one per test module)."""
    server = ZooKeeperServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def operator_kubeconfig(
    kube: Kube, chart_release: Release, tmp_path_factory: pytest.TempPathFactory,
    local_cluster: bool,
) -> Path:
    """A kubeconfig with the chart's ServiceAccount token, for the operator processes the tests
    run themselves: they have exactly the chart's RBAC. Local cluster only: on a real cluster
    the topic's pods really run (delayq image, ZooKeeper on this machine's loopback) and the
    chart's own operator pods would reconcile the test topics too."""
    if not local_cluster:
        pytest.skip("needs the local KWOK cluster: the operator runs as a local process, its "
                    "data plane on this machine's loopback")
    # the chart's default RBAC is a ClusterRole: its grants in one namespace are those of all
    return chart_kubeconfig(kube, chart_release, tmp_path_factory.mktemp("operator"), "default")


@pytest.fixture(scope="module")
def topics_ns(kube: Kube, chart_release: Release) -> Iterator[str]:
    """The namespace the module's local operator watches (and only that one), opted in to the
    chart's StatefulSet writes as a platform team does."""
    name = f"e2e-topics-{secrets.token_hex(3)}"
    tenant_namespace(kube, chart_release, name)
    kube.wait(lambda: kube.get("serviceaccount", "default", name), timeout_s=60,
              what=f"the default ServiceAccount in {name}")
    yield name
    kube.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")


@pytest.fixture(scope="module")
def operator(
    kube: Kube, chart_release: Release, zookeeper: ZooKeeperServer, topics_ns: str,
    operator_kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalOperator]:
    """``delayq operator --standalone -n <topics_ns>`` with the chart's ServiceAccount token."""
    workdir = tmp_path_factory.mktemp("operator")
    op = LocalOperator(
        repo=REPO, kubeconfig=operator_kubeconfig, namespaces=[topics_ns],
        log_path=workdir / "operator.log",
        env_overrides={**chart_env(kube, chart_release, zookeeper),
                       "DELAYQ_HEALTH_INTERVAL_S": "2"},
    )
    with op.running(kube, topics_ns):
        yield op


@pytest.fixture
def webhook_receiver() -> Iterator[tuple[str, receiver.Received]]:
    """A local webhook receiver on a free loopback port: (URL, received messages)."""
    with receiver.webhook_receiver() as found:
        yield found
