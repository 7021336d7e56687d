"""One real node beside the KWOK ones: containerd + runc + the CNI bridge, kubelet, kube-proxy.

Everything runs as plain processes inside the node's network namespace (:mod:`netns`), with its
state, sockets, configuration and logs in the session directory, and is stopped by PID. The node
registers tainted (:data:`REAL_NODE_TAINT`): only pods that tolerate it run for real, so the
KWOK-based tests keep their pretend pods. Images come from local archives (``e2e/images.sh``),
imported into this containerd; nothing is pulled.

What it changes outside its namespace and directory, and how that is undone:

* kubelet sets six kernel settings it requires (:data:`KUBELET_SYSCTLS`: memory overcommit,
  panic behaviour, key quotas) machine-wide; the harness records their values before and
  restores them after the node stops;
* cgroups under ``/kubepods`` in each cgroup v1 hierarchy (kubelet's cgroupfs driver), emptied
  when the pods stop; containerd's pod network namespaces under ``/var/run/netns`` and kubelet's
  links in ``/var/log/containers``, removed at stop if any were left.

One real node runs per machine at a time (a lock file): two kubelets would share ``/kubepods``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from delayq.local.waiting import wait_until
from e2e.harness.kube import Kube, condition
from e2e.harness.netns import NodeNetwork
from e2e.harness.pki import write_kubeconfig
from e2e.harness.process import (
    INTERVAL_S,
    NOT_YET,
    E2EError,
    ManagedProcess,
    Tools,
    await_ready,
    http_ok,
    spawn,
)

REAL_NODE = "real-node"
#: The taint the real node registers with, and the label pods select it by.
REAL_NODE_TAINT = {"key": "delayq.io/e2e-real-node", "value": "true", "effect": "NoSchedule"}
REAL_NODE_LABELS = {"delayq.io/e2e-node": "real"}
#: The pod network of the node (CNI bridge + host-local IPAM) and the cluster DNS address.
POD_SUBNET = "10.244.0.0/24"
CLUSTER_DNS_IP = "10.96.0.10"
#: What kubelet writes machine-wide (``protectKernelDefaults: false``), restored at stop.
KUBELET_SYSCTLS = ("vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic",
                   "kernel.panic_on_oops", "kernel.keys.root_maxkeys",
                   "kernel.keys.root_maxbytes")
#: Images the node imports from e2e/images.sh's archives at its start (the python base is only
#: a build stage; the pipeline image, 1.5 GB, is imported by the test that runs it:
#: `import_image`).
NODE_IMAGES = ("pause", "coredns", "delayq", "redis", "zookeeper")
LOCK_FILE = Path("/run/lock/delayq-e2e-real-node.lock")


@dataclass(frozen=True)
class Image:
    """A locally built image: its reference and the docker-archive it was saved to."""

    ref: str
    archive: Path


def placement() -> dict[str, Any]:
    """Pod spec fields that put a pod on the real node (its label and its taint)."""
    return {"nodeSelector": dict(REAL_NODE_LABELS), "tolerations": [dict(REAL_NODE_TAINT)]}


@dataclass
class RealNode:
    """The real node's processes and files under ``workdir``."""

    tools: Tools
    workdir: Path
    network: NodeNetwork
    server: str
    ca_file: Path
    node_token: str
    proxy_token: str
    images: dict[str, Image]
    processes: list[ManagedProcess] = field(default_factory=list)
    saved_sysctls: dict[str, str] = field(default_factory=dict)
    netns_before: frozenset[str] = frozenset()

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        process = spawn(name, [*self.network.exec_prefix(), *argv], self.workdir)
        self.processes.append(process)
        return process

    def ctr(self, *args: str, timeout: float = 300) -> str:
        """Run ``ctr`` against this node's containerd, in its ``k8s.io`` namespace."""
        result = subprocess.run(
            [self.tools.path("ctr"), "--address", str(self.containerd_socket), "-n", "k8s.io",
             *args], capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise E2EError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def kill_container(self, container_id: str) -> int:
        """SIGKILL the main process of a container (``containerd://<id>`` or the bare id)
        from the host, as an out-of-memory kill or a crash would end it; returns its PID."""
        wanted = container_id.removeprefix("containerd://")
        for line in self.ctr("tasks", "ls").splitlines()[1:]:
            task, pid, *_ = line.split()
            if task == wanted:
                os.kill(int(pid), 9)
                return int(pid)
        raise E2EError(f"no running task {wanted} on the real node")

    def tag_image(self, ref: str, new_ref: str) -> None:
        """A second tag of an imported image (what a registry push of a new tag would give)."""
        self.ctr("images", "tag", "--force", ref, new_ref)

    def import_image(self, name: str) -> None:
        """Import one more of e2e/images.sh's images into the node's containerd (unpacked), as
        `start` does its own; prints how long it took."""
        start = time.monotonic()
        self.ctr("images", "import", str(self.images[name].archive), timeout=600)
        print(f"e2e: image {name} imported in {time.monotonic() - start:.1f}s")

    def start(self, kube: Kube) -> None:
        """containerd (images imported), kubelet (node Ready), kube-proxy (healthy)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.netns_before = frozenset(os.listdir("/var/run/netns"))
        self._start_containerd()
        start = time.monotonic()
        for name in NODE_IMAGES:
            self.ctr("images", "import", str(self.images[name].archive))
        print(f"e2e: {len(NODE_IMAGES)} images imported in {time.monotonic() - start:.1f}s")
        self.saved_sysctls = {key: _sysctl(key) for key in KUBELET_SYSCTLS}
        self._start_kubelet(kube)
        self._start_kube_proxy()

    def _start_containerd(self) -> None:
        base = self.workdir / "containerd"
        cni = self.workdir / "cni"
        (cni / "net.d").mkdir(parents=True, exist_ok=True)
        (cni / "net.d" / "10-bridge.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0",
            "name": "delayq-e2e",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(cni / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }, indent=2))
        config = base / "config.toml"
        base.mkdir(parents=True, exist_ok=True)
        # restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, so the sandbox's OOM score
        # cannot be lowered below containerd's own (the start fails without it)
        config.write_text(f"""version = 2
root = "{base / 'root'}"
state = "{base / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{self.containerd_socket}"

[ttrpc]
  address = "{base / 'containerd.sock.ttrpc'}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.images['pause'].ref}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{self.tools.path('runc')}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni / 'net.d'}"
""")
        containerd = self._spawn("containerd", [self.tools.path("containerd"),
                                                f"--config={config}", "--log-level=info"])
        await_ready(containerd, lambda: self.ctr("version", timeout=5), 60)

    def _start_kubelet(self, kube: Kube) -> None:
        base = self.workdir / "kubelet"
        base.mkdir(parents=True, exist_ok=True)
        kubeconfig = base / "kubeconfig"
        write_kubeconfig(kubeconfig, self.server, self.ca_file, self.node_token)
        resolv = base / "resolv.conf"
        resolv.write_text(Path("/etc/resolv.conf").read_text())
        config = base / "config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.network.node_ip,
            "readOnlyPort": 0,
            "healthzBindAddress": self.network.node_ip,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.ca_file)}},
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "clusterDNS": [CLUSTER_DNS_IP],
            "clusterDomain": "cluster.local",
            "resolvConf": str(resolv),
            "podLogsDir": str(self.workdir / "pod-logs"),
            "registerWithTaints": [REAL_NODE_TAINT],
            "serializeImagePulls": False,
            # the imported images are never pulled again: no garbage collection of them
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "protectKernelDefaults": False,
            "rotateCertificates": False,
            "podPidsLimit": 4096,
            "maxPods": 50,
        }))
        labels = ",".join(f"{key}={value}" for key, value in REAL_NODE_LABELS.items())
        kubelet = self._spawn("kubelet", [
            self.tools.path("kubelet"), f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={base / 'root'}", f"--cert-dir={base / 'pki'}",
            f"--hostname-override={REAL_NODE}", f"--node-ip={self.network.node_ip}",
            f"--node-labels={labels}", "--v=1",
        ])
        await_ready(kubelet, lambda: http_ok(f"http://{self.network.node_ip}:10248/healthz"), 60)
        wait_until(lambda: condition(kube.get("node", REAL_NODE), "Ready") == "True", 120,
                   f"node {REAL_NODE} to be Ready", interval_s=INTERVAL_S, not_yet=NOT_YET,
                   abort=kubelet.exited)

    def _start_kube_proxy(self) -> None:
        base = self.workdir / "kube-proxy"
        base.mkdir(parents=True, exist_ok=True)
        kubeconfig = base / "kubeconfig"
        write_kubeconfig(kubeconfig, self.server, self.ca_file, self.proxy_token)
        config = base / "config.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "iptables",
            "clusterCIDR": POD_SUBNET,
            "hostnameOverride": REAL_NODE,
            "bindAddress": self.network.node_ip,
            "healthzBindAddress": f"{self.network.node_ip}:10256",
            "metricsBindAddress": f"{self.network.node_ip}:10249",
            # leave the machine-wide conntrack table size and timeouts alone
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
        }))
        proxy = self._spawn("kube-proxy", [self.tools.path("kube-proxy"), f"--config={config}"])
        await_ready(proxy, lambda: http_ok(f"http://{self.network.node_ip}:10256/healthz"), 60)

    def stop(self, kube: Kube) -> None:
        """Stop every pod (through the API, so kubelet tears their networks and volumes down),
        then the processes by PID, then whatever a crash left: tasks, shims, mounts, netns."""
        with contextlib.suppress(Exception):
            kube.kubectl("cordon", REAL_NODE)
            kube.kubectl("delete", "pods", "--all-namespaces", "--field-selector",
                         f"spec.nodeName={REAL_NODE}", "--grace-period=0", "--force",
                         "--wait=false")
            wait_until(lambda: not self.ctr("tasks", "ls", "-q", timeout=10).split(), 90,
                       "every container on the real node to stop")
        for process in reversed(self.processes):
            if process.name != "containerd":
                process.stop()
        with contextlib.suppress(Exception):
            for task in self.ctr("tasks", "ls", "-q", timeout=10).split():
                self.ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task, timeout=10)
        for process in self.processes:
            if process.name == "containerd":
                process.stop()
        _kill_matching(str(self.containerd_socket))  # shims outlive containerd by design
        _unmount_under(self.workdir)
        for name in set(os.listdir("/var/run/netns")) - self.netns_before:
            if name.startswith("cni-"):
                subprocess.run(["umount", f"/var/run/netns/{name}"], capture_output=True,
                               check=False)
                with contextlib.suppress(OSError):
                    os.unlink(f"/var/run/netns/{name}")
        _remove_links_into(Path("/var/log/containers"), self.workdir)
        for key, value in self.saved_sysctls.items():
            subprocess.run(["sysctl", "-qw", f"{key}={value}"], check=False)


def _remove_links_into(directory: Path, root: Path) -> None:
    """Remove the symlinks in ``directory`` that point below ``root``: kubelet's
    ``/var/log/containers`` links of containers it had no time to remove itself."""
    if not directory.is_dir():
        return
    for link in directory.iterdir():
        with contextlib.suppress(OSError):
            if link.is_symlink() and os.readlink(link).startswith(str(root) + "/"):
                link.unlink()


def _sysctl(key: str) -> str:
    return subprocess.run(["sysctl", "-n", key], capture_output=True, text=True,
                          check=True).stdout.strip()


def _kill_matching(text: str) -> None:
    """SIGKILL every process whose command line contains ``text`` (the node's own shims)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and int(pid) != os.getpid():
            with contextlib.suppress(OSError):
                os.kill(int(pid), 9)


def _unmount_under(root: Path) -> None:
    """Lazily unmount every mount point below ``root``, deepest first."""
    prefix = str(root) + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


@contextlib.contextmanager
def machine_lock(timeout_s: float) -> Iterator[IO[str]]:
    """Hold the one-real-node-per-machine lock (waiting up to ``timeout_s`` for another run)."""
    LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("w") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise E2EError(f"another e2e run holds {LOCK_FILE} (a real node)") from None
                time.sleep(1)
        yield handle


def load_images(manifest_line: str) -> dict[str, Image]:
    """The images e2e/images.sh reports (its one-line JSON)."""
    data = json.loads(manifest_line)
    return {name: Image(entry["image"], Path(entry["archive"])) for name, entry in data.items()}
