"""TLS to ZooKeeper: how every kazoo client of delayq reaches an ensemble's `secureClientPort`.

The digest logins of coordination/acl.py travel in clear on a plain connection; on a network
that is not trusted (a bring-your-own ensemble outside the cluster) the clients connect with
TLS instead. One settings object for the operator's store, the delay services' ownership and
their routing read, so all three connect the same way.

With `verify_certs` the server's certificate must chain to `ca_file` (or to a system CA when
it is empty) and name the host of the connection string (kazoo's `check_hostname`): a
certificate the CA issued for another host is refused too. Without it the connection is
encrypted but the server is not authenticated (anyone on the path can pose as the ensemble):
for trying things out only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ZkTls:
    """A client's TLS settings; `cert_file` and `key_file` (PEM) only for an ensemble that asks
    clients for a certificate (`ssl.clientAuth=need` or `want`)."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    verify_certs: bool = True

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("a ZooKeeper client certificate needs its key, and a key its cert")


def kazoo_options(tls: ZkTls | None) -> dict[str, Any]:
    """KazooClient keyword arguments for `tls` (none for a plain connection)."""
    if tls is None:
        return {}
    return {
        "use_ssl": True,
        "ca": tls.ca_file or None,
        "certfile": tls.cert_file or None,
        "keyfile": tls.key_file or None,
        "verify_certs": tls.verify_certs,
        "check_hostname": tls.verify_certs,
    }
