"""The ZooKeeper ensembles DelayTopics may use: the platform's choice, never a tenant's (pure).

`spec.zookeeper.connect` is a tenant's string. Used as written, it sent the operator's admin
digest to any host the tenant named, put the operator's admin writes anywhere inside another
tenant's tree (a chroot), let the garbage collector read the platform's tree under the wrong
root, and opened the service pods' egress to any port. So the string only *selects*: its hosts
(no chroot: the CRD and the spec parser refuse one) must all be hosts of one ensemble the
platform allows (the operator's default, chart `zookeeper.address`, and chart
`zookeeper.allowedEnsembles`), and what the operator and the service pods then use is that
ensemble's own connection string, its chroot included. The topic's tree under it is always
`/delayq/<namespace>/<topic>` (coordination/layout.py), from the topic's identity.

Hosts compare as written, lower-cased, with ZOOKEEPER_DEFAULT_PORT where the platform's entry
names no port: another spelling of the same address (an IP for a name, a trailing dot) is
refused, never guessed. No host may belong to two allowed ensembles, so the selection is never
ambiguous (the same servers under two chroots are one ensemble to a tenant: which chroot it
gets is the platform's choice).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from delayq.kube.spec import ZOOKEEPER_DEFAULT_PORT

ALLOWED_ENSEMBLES_ENV = "DELAYQ_ZOOKEEPER_ALLOWED_ENSEMBLES"
#: The most ensembles an operator may allow: each holds a client, a session and a thread pool.
MAX_ENSEMBLES = 16
_PLATFORM_CONNECT = re.compile(
    r"^[A-Za-z0-9.\-]+(:[0-9]{1,5})?(,[A-Za-z0-9.\-]+(:[0-9]{1,5})?)*(/[A-Za-z0-9_./\-]*)?$"
)


class EnsembleRefused(ValueError):
    """A tenant's `spec.zookeeper.connect` names a host of no allowed ensemble."""


def ensemble_hosts(connect: str) -> frozenset[str]:
    """The `host:port` entries of a connection string, lower-cased, chroot dropped."""
    hosts = set()
    for host in connect.split("/", 1)[0].split(","):
        name, colon, port = host.strip().rpartition(":")
        if not colon:
            name, port = port, str(ZOOKEEPER_DEFAULT_PORT)
        hosts.add(f"{name.lower()}:{int(port)}")
    return frozenset(hosts)


def check_ensembles(connects: Sequence[str]) -> None:
    """The platform's ensembles are well-formed, at most MAX_ENSEMBLES, and share no host;
    a ValueError says which entry is wrong (the operator stops with it)."""
    if len(connects) > MAX_ENSEMBLES:
        raise ValueError(f"at most {MAX_ENSEMBLES} ZooKeeper ensembles, not {len(connects)}")
    seen: dict[str, str] = {}
    for connect in connects:
        if not _PLATFORM_CONNECT.match(connect):
            raise ValueError(
                f"ZooKeeper ensemble {connect!r} must look like host[:port][,host[:port]][/path]"
            )
        for host in ensemble_hosts(connect):
            if host in seen:
                raise ValueError(
                    f"ZooKeeper ensembles {seen[host]!r} and {connect!r} share host {host}: "
                    "a topic naming it could not tell them apart"
                )
            seen[host] = connect


def platform_connect(tenant_connect: str, ensembles: Sequence[str]) -> str:
    """The connection string a topic uses: `ensembles[0]` (the operator's default) when the
    tenant names none, else the allowed ensemble holding every host the tenant named. Raises
    EnsembleRefused, naming the rule, for anything else."""
    if not tenant_connect:
        return ensembles[0]
    named = ensemble_hosts(tenant_connect)
    for connect in ensembles:
        if named <= ensemble_hosts(connect):
            return connect
    allowed = "; ".join(",".join(sorted(ensemble_hosts(connect))) for connect in ensembles)
    raise EnsembleRefused(
        f"spec.zookeeper.connect {tenant_connect!r} names a host of no ZooKeeper ensemble the "
        f"platform allows (zookeeper.address, zookeeper.allowedEnsembles: {allowed}); leave "
        "it empty for the operator's default or ask the platform team."
    )
