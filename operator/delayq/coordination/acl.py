"""Who may touch a topic's ZooKeeper tree: digest identities and the ACL every node carries (pure).

One ZooKeeper serves every topic of every namespace, so a node without an ACL is writable by any
pod that reaches the ensemble: it could rewrite another topic's `assignment`, `owners` or
`routing` and stall or misroute its delivery. Every node of a topic's tree therefore carries
exactly two entries, both with every permission:

* the topic's identity, `digest:<namespace>.<topic>:<hash>`: its delay-service pods log in with
  the password from the topic's Secret (key `zookeeper-password`);
* the operator's identity, `digest:delayq-operator:<hash>`: it creates the tree, publishes the
  routing, counts owners and removes the tree of a deleted topic. Services learn only its ACL id
  (the hash, from `topic.json`), never its password.

ZooKeeper checks ACLs per node (a parent's ACL does not protect its children), so the services
create their own nodes with the same two entries (`default_acl`). The parents (`/delayq`,
`/delayq/<namespace>`) are the operator's alone: no tenant can create (squat) the root of a topic
that is not its own, nor list the namespaces and topics that share the ensemble (issue 27: a
listable victim was a target). A service never needs them: ZooKeeper checks no permission on
the ancestors of a path it reads or writes. `exists` is never checked by ZooKeeper, so a node
whose name is guessed can still be seen to exist: names are not secret, contents are. The
connection's root and the quotas are closed by coordination/quota.py.

The digest scheme is ZooKeeper's built-in one (SHA-1 of `user:password`, sent in clear on
connect): with random 32-byte passwords the hash cannot be reversed; confidentiality on the
wire needs TLS to the ensemble (docs/security.md). kazoo's own helpers compute the hashes.
"""

from __future__ import annotations

from dataclasses import dataclass

from kazoo.security import ACL, Id, Permissions, make_digest_acl_credential

#: The operator's ZooKeeper user; its password is the operator's `zookeeper_admin_password`.
ADMIN_USER = "delayq-operator"
DIGEST = "digest"


def topic_user(namespace: str, topic: str) -> str:
    """The topic's ZooKeeper user. Namespaces and topic names are DNS labels (no dots, no
    colons), so `<namespace>.<topic>` is unique and never splits the digest's `user:password`."""
    return f"{namespace}.{topic}"


@dataclass(frozen=True)
class ZkIdentity:
    """A digest user and its password: what a client logs in with (`auth_data`)."""

    user: str
    password: str

    @property
    def auth_data(self) -> tuple[str, str]:
        return (DIGEST, f"{self.user}:{self.password}")

    @property
    def acl_id(self) -> str:
        """`user:base64(sha1(user:password))`: how an ACL names this identity."""
        return str(make_digest_acl_credential(self.user, self.password))


def digest_acl(acl_id: str) -> ACL:
    """Every permission for the identity an ACL id (`user:hash`) names."""
    return ACL(Permissions.ALL, Id(DIGEST, acl_id))


def tree_acl(topic_acl_id: str, admin_acl_id: str) -> list[ACL]:
    """The ACL of every node of a topic's tree: the topic and the operator, nobody else."""
    return [digest_acl(topic_acl_id), digest_acl(admin_acl_id)]


def parent_acl(admin_acl_id: str) -> list[ACL]:
    """`/delayq` and `/delayq/<namespace>`: the operator's alone (it lists them for GC)."""
    return [digest_acl(admin_acl_id)]
