"""The real node's own network: a network namespace joined to the host by a veth pair.

The real node (containerd, kubelet, kube-proxy and its pods) runs inside this namespace, so
everything it changes in the network stack (the CNI bridge, pod routes, kube-proxy's iptables
chains, per-namespace sysctls such as ``ip_forward``) stays there and vanishes with it: nothing
is left on the shared machine, and two e2e sessions on one machine cannot collide. The API server
listens on the host end of the pair, an address only this machine can reach, so both the tests on
the host and the pods inside the namespace talk to it.
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess
from dataclasses import dataclass

from e2e.harness.process import E2EError

#: The /24 networks the veth pairs are numbered from: 10.250.<n>.0/24, host .1, node .2.
VETH_SUPERNET = ipaddress.IPv4Network("10.250.0.0/16")


def _ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise E2EError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


@dataclass(frozen=True)
class NodeNetwork:
    """A network namespace named ``name`` with ``node_ip`` on its ``eth0``, its default route via
    ``host_ip`` on the host's ``host_interface``."""

    name: str
    host_interface: str
    host_ip: str
    node_ip: str

    @classmethod
    def create(cls) -> NodeNetwork:
        """Create the namespace and the pair on the first 10.250.<n>.0/24 no interface uses."""
        used = _ip("-4", "-o", "addr", "show")
        for subnet in list(VETH_SUPERNET.subnets(new_prefix=24))[1:]:
            host_ip, node_ip = str(subnet[1]), str(subnet[2])
            if f" {host_ip}/" in used or f" {node_ip}/" in used:
                continue
            suffix = secrets.token_hex(3)
            network = cls(f"delayq-e2e-{suffix}", f"dqe2e{suffix}", host_ip, node_ip)
            network._set_up()
            return network
        raise E2EError(f"no free /24 left in {VETH_SUPERNET} for the real node's network")

    def _set_up(self) -> None:
        _ip("netns", "add", self.name)
        try:
            _ip("link", "add", self.host_interface, "type", "veth", "peer", "name", "eth0",
                "netns", self.name)
            _ip("addr", "add", f"{self.host_ip}/24", "dev", self.host_interface)
            _ip("link", "set", self.host_interface, "up")
            _ip("-n", self.name, "addr", "add", f"{self.node_ip}/24", "dev", "eth0")
            _ip("-n", self.name, "link", "set", "eth0", "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
            _ip("-n", self.name, "route", "add", "default", "via", self.host_ip)
            # pods route through the namespace: forwarding is a per-namespace setting
            subprocess.run([*self.exec_prefix(), "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                           check=True)
        except BaseException:
            self.delete()
            raise

    def exec_prefix(self) -> list[str]:
        """The argv prefix that runs a command inside the namespace.

        ``nsenter --net`` rather than ``ip netns exec``: the latter also gives the command a
        mount namespace with a fresh ``/sys``, where kubelet finds no cgroup mounts.
        """
        return ["nsenter", f"--net=/var/run/netns/{self.name}", "--"]

    def delete(self) -> None:
        """Remove the namespace; its end of the pair goes with it, and so does the host's."""
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", self.host_interface], capture_output=True,
                       check=False)
