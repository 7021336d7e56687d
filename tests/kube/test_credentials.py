"""The topics' credentials without Secret reads in tenants' namespaces (kube/credentials.py).

Against kmock, which serves whatever is asked: the tests assert the requests themselves, so a
`get` on a tenant's Secret (which the chart's RBAC no longer grants: e2e runs the operator with
that RBAC on a real API server) fails here too.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import re
from typing import Any

import kmock
import pytest

from delayq.kube import naming
from delayq.kube.context import OperatorContext
from delayq.kube.credentials import MISSING_REASON, collect_copies
from delayq.kube.errors import TopicFailure
from delayq.kube.handlers.health import refresh
from delayq.kube.handlers.reconcile import reconcile
from tests.kube.conftest import DT
from tests.kube.pods import NAMESPACE, OPERATOR_NAMESPACE, RedisPods
from tests.kube.test_handlers import (
    body,
    existing,
    get,
    provision,
    put_topic,
    update_spec,
    write_status,
)

SECRETS = "v1/secrets"
TENANT = "orders-credentials"
OPERATOR_KEYS = (
    naming.SECRET_REDIS_PASSWORD,
    naming.SECRET_REDIS_ADMIN_PASSWORD,
    naming.SECRET_ZOOKEEPER_PASSWORD,
    naming.SECRET_LEASE_TOKEN_KEY,
)
# what Kubernetes requires of a Secret's name (a DNS subdomain)
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def the_copy(
    api: kmock.KubernetesEmulator, topic: str = "orders", namespace: str = NAMESPACE
) -> dict[str, Any] | None:
    try:
        obj = api.objects[SECRETS, OPERATOR_NAMESPACE, naming.credentials_copy(namespace, topic)]
    except KeyError:
        return None
    return None if obj.deleted else dict(obj.raw)


def tenant_secret_reads(api: kmock.KubernetesEmulator) -> list[str]:
    """Every get, list or watch of Secrets in the tenant's namespace the operator sent."""
    return [
        f"{request.method.value} {request.url}"
        for request in api
        if request.method.value == "GET"
        and request.resource is not None
        and request.resource.plural == "secrets"
        and request.namespace != OPERATOR_NAMESPACE
    ]


def put_data(api: kmock.KubernetesEmulator, name: str, data: dict[str, str]) -> None:
    secret = existing(api, SECRETS, name)
    api.objects[SECRETS, NAMESPACE, name] = {**secret, "data": data}


def encoded(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def test_the_operator_reads_no_secret_in_the_tenants_namespace(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    put_topic(api, topicType="stream", replicasPerBroker=0)  # with the reader's Secret too
    await provision(api, ctx, logger)
    update_spec(api, topicType="stream", replicasPerBroker=0, maxRetries=3)
    await provision(api, ctx, logger)
    write_status(api, await refresh(ctx, body(api), logger))
    assert tenant_secret_reads(api) == []
    copy = the_copy(api)
    assert copy is not None
    assert copy["metadata"]["annotations"][naming.TOPIC_UID_ANNOTATION] == "uid-orders"
    tenant = existing(api, SECRETS, TENANT)["data"]
    assert {key: copy["data"][key] for key in tenant} == tenant  # the same values
    reader = existing(api, SECRETS, "orders-stream-reader")["data"]
    assert (
        copy["data"][naming.COPY_STREAM_READER_PASSWORD]
        == reader[naming.SECRET_STREAM_READER_PASSWORD]
    )


async def test_a_tampered_or_deleted_tenant_secret_is_written_again_from_the_copy(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    put_topic(api)
    await provision(api, ctx, logger)
    first = existing(api, SECRETS, TENANT)["data"]
    rotated = {
        naming.SECRET_API_TOKEN: encoded("the-tenants-new-token"),
        naming.SECRET_API_TOKEN_PREVIOUS: first[naming.SECRET_API_TOKEN],
    }
    tampered = {**first, naming.SECRET_REDIS_PASSWORD: encoded("chosen-by-the-tenant"), **rotated}
    del tampered[naming.SECRET_ZOOKEEPER_PASSWORD]
    put_data(api, TENANT, tampered)
    update_spec(api, maxRetries=3)
    await provision(api, ctx, logger)
    repaired = existing(api, SECRETS, TENANT)["data"]
    for key in OPERATOR_KEYS:  # what the brokers, ZooKeeper and the other pods hold
        assert repaired[key] == first[key], key
    # the API token is the tenant's to rotate (docs/operator.md): left as the tenant wrote it
    assert {key: repaired[key] for key in rotated} == rotated

    del api.objects[SECRETS, NAMESPACE, TENANT]
    update_spec(api, maxRetries=4)
    await provision(api, ctx, logger)
    assert existing(api, SECRETS, TENANT)["data"] == first  # what the running pods hold
    assert tenant_secret_reads(api) == []


async def test_the_operator_logs_in_with_its_copy_not_the_tenants_secret(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    redis_pods: RedisPods,
    logger: logging.Logger,
) -> None:
    put_topic(api, brokers=1, slotAmount=4, replicasPerBroker=1)
    await provision(api, ctx, logger)
    redis_pods.add(0, 2)  # started with the Secret's passwords, as pods are
    first = existing(api, SECRETS, TENANT)["data"]
    put_data(api, TENANT, {**first, naming.SECRET_REDIS_ADMIN_PASSWORD: encoded("wrong")})
    write_status(api, await refresh(ctx, body(api), logger))
    put_data(api, TENANT, first)  # what the test's own Redis client logs in with
    assert redis_pods.replication("orders-redis-0-0")["role"] == "master"  # it logged in
    assert body(api)["status"]["brokers"][0]["masterPod"] == "orders-redis-0-0"


async def test_a_topic_created_again_under_its_name_never_gets_the_old_credentials(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    put_topic(api)
    await provision(api, ctx, logger)
    old = existing(api, SECRETS, TENANT)["data"]
    del api.objects[DT, NAMESPACE, "orders"]  # its Secret still there: the GC is not done yet
    put_topic(api)
    api.objects[DT, NAMESPACE, "orders"].patch({"metadata": {"uid": "uid-orders-again"}})
    await provision(api, ctx, logger)
    new = existing(api, SECRETS, TENANT)
    assert all(new["data"][key] != value for key, value in old.items()), "a credential kept"
    assert [ref["uid"] for ref in new["metadata"]["ownerReferences"]] == ["uid-orders-again"]
    copy = the_copy(api)
    assert copy is not None
    assert copy["metadata"]["annotations"][naming.TOPIC_UID_ANNOTATION] == "uid-orders-again"
    assert set(copy["data"].values()).isdisjoint(old.values())


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("a", "b-c"), ("a-b", "c")),  # one join with '-' would give both `a-b-c`
        (("shop", "credentials-x"), ("shop-credentials", "x")),
        (("a" * 63, "b" * 43), ("a" * 62, "a" + "b" * 43)),
    ],
)
def test_no_two_topics_share_a_copy(one: tuple[str, str], other: tuple[str, str]) -> None:
    names = {naming.credentials_copy(*one), naming.credentials_copy(*other)}
    assert len(names) == 2
    for name in names:
        assert len(name) <= 253, name
        assert DNS_SUBDOMAIN.match(name), name


async def test_a_provisioned_topic_without_a_copy_is_refused_unless_its_secret_may_be_read(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    """An earlier operator's topic: new credentials would lock its running pods out."""
    put_topic(api)
    await provision(api, ctx, logger)
    first = existing(api, SECRETS, TENANT)
    del api.objects[SECRETS, OPERATOR_NAMESPACE, naming.credentials_copy(NAMESPACE, "orders")]
    update_spec(api, maxRetries=3)
    with pytest.raises(TopicFailure) as caught:
        await reconcile(ctx, body(api), logger)
    assert caught.value.permanent
    (provisioned,) = [c for c in caught.value.status["conditions"] if c["type"] == "Provisioned"]
    assert provisioned["reason"] == MISSING_REASON
    assert "operator.legacySecretRead" in provisioned["message"]
    assert existing(api, SECRETS, TENANT) == first  # nothing written
    assert the_copy(api) is None
    before = len(list(api))
    assert await refresh(ctx, body(api), logger) == {}  # no health pass without a login
    assert [r.url.path for r in list(api)[before:] if r.method.value != "GET"] == []

    ctx.config = dataclasses.replace(ctx.config, legacy_secret_read=True)
    await provision(api, ctx, logger)
    copy = the_copy(api)
    assert copy is not None
    assert {key: copy["data"][key] for key in first["data"]} == first["data"]  # seeded
    assert existing(api, SECRETS, TENANT)["data"] == first["data"]  # nothing rotated


async def test_a_seed_value_that_is_not_text_is_refused_naming_its_key(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    """Regression: with legacySecretRead, a tenant's Secret holding bytes that are not UTF-8
    crashed the reconcile with a UnicodeDecodeError traceback. It is refused, the key named,
    nothing written."""
    put_topic(api)
    await provision(api, ctx, logger)
    del api.objects[SECRETS, OPERATOR_NAMESPACE, naming.credentials_copy(NAMESPACE, "orders")]
    first = existing(api, SECRETS, TENANT)
    garbled = base64.b64encode(b"\xff\xfe not text").decode()
    put_data(api, TENANT, {**first["data"], naming.SECRET_REDIS_PASSWORD: garbled})
    tampered = existing(api, SECRETS, TENANT)
    ctx.config = dataclasses.replace(ctx.config, legacy_secret_read=True)
    update_spec(api, maxRetries=3)
    with pytest.raises(TopicFailure) as caught:
        await reconcile(ctx, body(api), logger)
    assert caught.value.permanent
    (provisioned,) = [c for c in caught.value.status["conditions"] if c["type"] == "Provisioned"]
    assert provisioned["reason"] == MISSING_REASON
    assert f"key {naming.SECRET_REDIS_PASSWORD} of Secret {NAMESPACE}/{TENANT}" in (
        provisioned["message"]
    )
    assert "not UTF-8 text" in provisioned["message"]
    assert existing(api, SECRETS, TENANT) == tampered  # nothing written
    assert the_copy(api) is None


async def test_the_copies_of_deleted_topics_are_collected(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    for name in ("orders", "gone"):
        put_topic(api, name)
        write_status(api, await reconcile(ctx, body(api, name), logger), name)
    del api.objects[DT, NAMESPACE, "gone"]
    unwatched = {**(the_copy(api, "gone") or {})}
    unwatched["metadata"] = {
        "name": naming.credentials_copy("elsewhere", "gone"),
        "namespace": OPERATOR_NAMESPACE,
        "labels": {**unwatched["metadata"]["labels"], naming.LABEL_TOPIC_NAMESPACE: "elsewhere"},
        "annotations": unwatched["metadata"]["annotations"],
    }
    api.objects[SECRETS, OPERATOR_NAMESPACE, unwatched["metadata"]["name"]] = unwatched
    assert await collect_copies(ctx, [NAMESPACE], logger) == 1
    assert the_copy(api, "gone") is None
    assert the_copy(api, "orders") is not None
    assert get(api, SECRETS, TENANT) is not None
    # a namespace this operator does not watch is not its to collect
    assert the_copy(api, "gone", "elsewhere") is not None
    assert await collect_copies(ctx, [NAMESPACE], logger) == 0
