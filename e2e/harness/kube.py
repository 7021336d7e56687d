"""``Kube``, the thin ``kubectl``/``helm`` client the tests use, and helpers on its objects.

It drives the same ``kubectl`` a user would, so a test of "``kubectl apply`` of a bad spec
fails with a clear message" asserts exactly what users see.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from delayq.local.waiting import wait_until
from e2e.harness.process import INTERVAL_S, NOT_YET, E2EError, Tools

T = TypeVar("T")


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

    def helm(self, *args: str, timeout: float = 300,
             check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster; raise with its stderr on failure unless ``check``
        is false."""
        result = subprocess.run(
            [self.tools.path("helm"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True, text=True, timeout=timeout, check=False, env=self.env(),
        )
        if check and result.returncode != 0:
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
