"""A topic's credentials: the operator's own copy in its namespace; tenants' Secrets write-only.

Reading `<t>-credentials` back from the tenant's namespace needed `get` on Secrets in every
namespace (issue 34): whoever held the operator's identity read every Secret of the cluster. The
operator now keeps what it generated for a topic in a Secret of its own namespace,
`delayq-credentials.<ns>.<topic>` (naming.credentials_copy), and only creates and patches the
tenant's Secrets (`apply.write_secret`), never reading them. The rules:

- A copy belongs to one DelayTopic: it records the topic's UID, and a copy with another UID is
  no copy at all. A topic deleted and created again under the same name gets new credentials
  (its copy is overwritten), never the old topic's.
- No copy of this topic, and the topic was never provisioned (no `status.appliedSlotAmount`):
  new values. Provisioned, by an operator that kept no copy: with `legacy_secret_read` (chart
  `operator.legacySecretRead`, for the release after the change) the tenant's Secret is read
  once to seed the copy, if the topic owns it; without it the topic is refused
  (`CredentialsCopyMissing`): new values would lock its running pods out of their brokers and
  ZooKeeper tree, so nothing is applied and the condition says what to do.
- The operator logs in (Redis admin user, ZooKeeper digest) with its copy's values only
  (`operator_credentials`), so a tenant rewriting its Secret cannot steer the operator's logins.
- The leader's health loop deletes the copies whose topic is gone (`collect_copies`), as it
  collects ZooKeeper trees (zk_gc.py).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from delayq.kube import naming
from delayq.kube.builders.common import Credentials, Manifest, has_stream_reader, secret_value
from delayq.kube.client import KubeApiError
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.spec import TopicSpec
from delayq.kube.topics import list_topics

COPY_LABELS = {
    naming.LABEL_MANAGED_BY: naming.MANAGED_BY,
    naming.LABEL_COMPONENT: naming.COMPONENT_CREDENTIALS_COPY,
}
# Credentials field -> its key in the copy (the same key as in the tenant's Secret)
COPY_KEYS = {
    "redis_password": naming.SECRET_REDIS_PASSWORD,
    "api_token": naming.SECRET_API_TOKEN,
    "zookeeper_password": naming.SECRET_ZOOKEEPER_PASSWORD,
    "redis_admin_password": naming.SECRET_REDIS_ADMIN_PASSWORD,
    "read_token": naming.SECRET_READ_TOKEN,
    "metrics_token": naming.SECRET_METRICS_TOKEN,
    "operator_metrics_token": naming.SECRET_OPERATOR_METRICS_TOKEN,
    "lease_token_key": naming.SECRET_LEASE_TOKEN_KEY,
    "stream_reader_password": naming.COPY_STREAM_READER_PASSWORD,
    "backup_password": naming.SECRET_BACKUP_PASSWORD,
}
MISSING_REASON = "CredentialsCopyMissing"


class CredentialsCopyMissing(Exception):
    """A provisioned topic has no copy of its credentials and the operator may not read the
    tenant's Secret to make one."""


class UnreadableValue(ValueError):
    """A Secret's value that is not UTF-8 text (`key`): never one the operator wrote."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def decoded(secret: Mapping[str, Any] | None) -> dict[str, str]:
    """The Secret's values as text; UnreadableValue names the first key that is none."""
    data = (secret or {}).get("data") or {}
    values = {}
    for key, value in data.items():
        if not value:
            continue
        try:
            values[key] = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise UnreadableValue(key) from None
    return values


def _tenant_decoded(secret: Manifest | None, namespace: str, name: str) -> dict[str, str]:
    """A tenant's Secret's values to seed a copy from: the tenant may have written anything
    there, so a value that is not text refuses the seed, naming its key (not a traceback)."""
    try:
        return decoded(secret)
    except UnreadableValue as error:
        raise CredentialsCopyMissing(
            f"The key {error.key} of Secret {namespace}/{name}, read once to seed the "
            "operator's copy of this topic's credentials (operator.legacySecretRead), is not "
            "UTF-8 text, so it cannot be a credential the operator wrote. Put the value back "
            "or delete and recreate the topic. Nothing is applied; running pods keep their "
            "credentials."
        ) from None


def topic_uid(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("uid") or "")


def copy_of(secret: Manifest | None, uid: str) -> dict[str, str] | None:
    """The copy's values if it is this topic's (records `uid`), else None."""
    annotations = ((secret or {}).get("metadata") or {}).get("annotations") or {}
    if secret is None or not uid or annotations.get(naming.TOPIC_UID_ANNOTATION) != uid:
        return None
    return decoded(secret)


def owned_by(secret: Manifest | None, uid: str) -> bool:
    references = ((secret or {}).get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(reference.get("uid") == uid for reference in references)


async def get_copy(ctx: OperatorContext, spec: TopicSpec) -> Manifest | None:
    name = naming.credentials_copy(spec.namespace, spec.name)
    return await ctx.kube.get("v1", "Secret", ctx.build.operator_namespace, name)


async def operator_credentials(
    ctx: OperatorContext, body: Mapping[str, Any], spec: TopicSpec
) -> dict[str, str]:
    """The values the operator logs in to the topic's Redis and ZooKeeper with: its copy's
    (empty before the topic's first reconcile made one), never the tenant's Secret's."""
    return copy_of(await get_copy(ctx, spec), topic_uid(body)) or {}


@dataclass(frozen=True)
class TopicCredentials:
    """A topic's credentials as a reconcile found or made them, and what its copy needs."""

    values: Credentials
    uid: str
    # no copy of this topic yet: its Secrets are written whole, tokens included, rather than
    # repaired (apply.write_secret), and the copy is written after them
    fresh: bool
    copy: Manifest | None  # the copy as read (None: absent), to be replaced
    changed: bool  # the copy must be written (save_copy)

    @property
    def kept_keys(self) -> frozenset[str]:
        """Keys of the tenant's Secrets a reconcile leaves as they are: the tokens the tenant
        may rotate (docs/operator.md, "Rotating the API token"), once the Secret was written."""
        return frozenset() if self.fresh else naming.TENANT_ROTATED_KEYS

    def copied(self) -> dict[str, str]:
        return {
            key: getattr(self.values, field)
            for field, key in COPY_KEYS.items()
            if getattr(self.values, field)
        }


async def read_or_generate_credentials(
    ctx: OperatorContext, body: Mapping[str, Any], spec: TopicSpec
) -> TopicCredentials:
    """The topic's credentials: its copy's, new ones for a new topic, or an earlier operator's
    Secret's (seed). Raises CredentialsCopyMissing (see the module's rules)."""
    uid = topic_uid(body)
    existing = await get_copy(ctx, spec)
    kept = copy_of(existing, uid)
    values = await seed(ctx, body, spec, uid) if kept is None else kept

    def kept_or_new(field: str) -> str:
        return values.get(COPY_KEYS[field]) or ctx.generate()

    credentials = Credentials(
        redis_password=kept_or_new("redis_password"),
        api_token=kept_or_new("api_token"),
        zookeeper_password=kept_or_new("zookeeper_password"),
        redis_admin_password=kept_or_new("redis_admin_password"),
        read_token=kept_or_new("read_token"),
        metrics_token=kept_or_new("metrics_token"),
        lease_token_key=kept_or_new("lease_token_key"),
        operator_metrics_token=kept_or_new("operator_metrics_token"),
        # dropped from the copy while nobody reads broker 0: back there, the consumers get a
        # new login
        stream_reader_password=(
            kept_or_new("stream_reader_password") if has_stream_reader(spec) else ""
        ),
        backup_password=kept_or_new("backup_password") if spec.backup is not None else "",
    )
    found = TopicCredentials(credentials, uid, kept is None, existing, changed=True)
    return dataclasses.replace(found, changed=found.copied() != kept)


async def save_copy(ctx: OperatorContext, spec: TopicSpec, found: TopicCredentials) -> None:
    """Write the copy if it changed: after the tenant's Secrets, so that a copy exists only
    once they were written whole (a reconcile interrupted before retries as for a new topic,
    and never leaves another topic's tokens in a Secret it only repairs)."""
    if found.changed:
        await write_copy(ctx, spec, found.uid, found.copy, found.copied())


async def seed(
    ctx: OperatorContext, body: Mapping[str, Any], spec: TopicSpec, uid: str
) -> dict[str, str]:
    """The values to start this topic's copy from: none for a topic never provisioned; the
    tenant's Secrets' (if this topic owns them) with legacy_secret_read; else refused."""
    if not (body.get("status") or {}).get("appliedSlotAmount"):
        return {}
    if not ctx.config.legacy_secret_read:
        raise CredentialsCopyMissing(
            "The operator keeps its own copy of each topic's credentials and this topic, "
            "provisioned by an earlier operator, has none; new credentials would lock its "
            "running pods out. Set the chart's operator.legacySecretRead=true for one release "
            f"(the operator reads {naming.credentials_secret(spec.name)} once), or delete and "
            "recreate the topic. Nothing is applied; running pods keep their credentials."
        )
    name = naming.credentials_secret(spec.name)
    secret = await ctx.kube.get("v1", "Secret", spec.namespace, name)
    values = _tenant_decoded(secret, spec.namespace, name) if owned_by(secret, uid) else {}
    if has_stream_reader(spec):
        reader_name = naming.stream_reader_secret(spec.name)
        reader = await ctx.kube.get("v1", "Secret", spec.namespace, reader_name)
        if owned_by(reader, uid):
            reader_values = _tenant_decoded(reader, spec.namespace, reader_name)
            password = reader_values.get(naming.SECRET_STREAM_READER_PASSWORD, "")
            values[naming.COPY_STREAM_READER_PASSWORD] = password
    return {key: value for key, value in values.items() if key in COPY_KEYS.values()}


async def write_copy(
    ctx: OperatorContext,
    spec: TopicSpec,
    uid: str,
    existing: Manifest | None,
    values: Mapping[str, str],
) -> None:
    """Create the copy, or replace its values (and UID) in place: a key it no longer holds is
    removed, so nothing of another topic's copy survives."""
    namespace = ctx.build.operator_namespace
    name = naming.credentials_copy(spec.namespace, spec.name)
    labels = {
        **COPY_LABELS,
        naming.LABEL_TOPIC_NAMESPACE: spec.namespace,
        naming.LABEL_TOPIC: spec.name,
    }
    metadata = {"labels": labels, "annotations": {naming.TOPIC_UID_ANNOTATION: uid}}
    data: dict[str, str | None] = {key: secret_value(value) for key, value in values.items()}
    if existing is None:
        manifest = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace, **metadata},
            "data": data,
        }
        await ctx.kube.create(manifest)
        return
    data.update({key: None for key in existing.get("data") or {} if key not in values})
    await ctx.kube.patch("v1", "Secret", namespace, name, {"metadata": metadata, "data": data})


async def collect_copies(
    ctx: OperatorContext, namespaces: Sequence[str], logger: Logger
) -> int:
    """Delete the copies whose DelayTopic is gone; returns how many.

    The copies are listed before the topics (a copy is only written for a topic that exists,
    so a topic created meanwhile is in the second listing); each is deleted under its topic's
    lock (no reconcile of it runs meanwhile) and only as it was listed (the API refuses the
    delete if a reconcile rewrote it since). A copy of a namespace the operator does not watch
    is left alone.
    """
    operator_namespace = ctx.build.operator_namespace
    copies = await ctx.kube.list("v1", "Secret", operator_namespace, COPY_LABELS)
    uids = {topic_uid(topic) for topic in await list_topics(ctx.kube, namespaces)}
    removed = 0
    for secret in copies:
        meta = secret["metadata"]
        labels = meta.get("labels") or {}
        namespace = str(labels.get(naming.LABEL_TOPIC_NAMESPACE) or "")
        topic = str(labels.get(naming.LABEL_TOPIC) or "")
        uid = (meta.get("annotations") or {}).get(naming.TOPIC_UID_ANNOTATION)
        if uid in uids or (namespaces and namespace not in namespaces):
            continue
        seen = {key: meta[key] for key in ("uid", "resourceVersion") if key in meta}
        async with ctx.lock(namespace, topic):
            try:
                deleted = await ctx.kube.delete(
                    "v1", "Secret", operator_namespace, meta["name"], preconditions=seen
                )
            except KubeApiError as error:
                if error.status != 409:
                    raise
                continue  # rewritten by a reconcile since the listing: a live topic's
        if deleted:
            logger.info("removed the credentials copy of deleted topic %s/%s", namespace, topic)
            removed += 1
    return removed
