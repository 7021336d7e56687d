"""The stream target of a DelayTopic (`spec.delivery.stream`): the parser, the builders and the
platform's cap. Where a stream topic's entries go, who may read them, and what reaches the pods:
either an external Redis from the tenant's Secret, or broker 0 with the operator's reader user."""

from __future__ import annotations

import base64
import logging
from typing import Any
from urllib.parse import urlsplit

import kmock
import pytest

from delayq.kube import naming
from delayq.kube.builders.bundle import render
from delayq.kube.builders.common import Credentials
from delayq.kube.builders.service import NON_PUBLIC_IPV4
from delayq.kube.context import OperatorContext
from delayq.kube.spec import STREAM_TARGETS_WITHOUT_URL_MESSAGE, SpecError, TopicSpec
from delayq.kube.tenant_policy import TenantPolicy
from delayq.queue import acl
from delayq.service.config import ConfigError, ServiceConfig
from delayq.service.delivery.targets import parse_cidrs

from .manifests import CREDS, CTX, OWNER, by_kind_name, egress_of, rendered, spec_of
from .pods import NAMESPACE
from .test_handlers import STS, body, existing, get, provision, put_topic, update_spec

EXTERNAL = {"urlSecretRef": {"name": "events-redis", "key": "url"}}
READER = "orders-stream-reader"
SECRETS = "v1/secrets"
POLICIES = "networking.k8s.io/v1/networkpolicies"
READERS = "orders-redis-readers"
CONSUMERS = {"podSelector": {"matchLabels": {"app": "orders-consumer"}}}
WITH_READER = Credentials(**{**vars(CREDS), "stream_reader_password": "r/p@ss"})


def stream_spec(stream: dict[str, Any] | None = None, **fields: Any) -> TopicSpec:
    return spec_of(topicType="stream", delivery={"stream": stream or {}}, **fields)


def env_of(manifest: dict[str, Any]) -> dict[str, Any]:
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in container["env"]}


def test_an_external_target_comes_from_the_tenants_secret() -> None:
    spec = stream_spec({**EXTERNAL, "allowedCidrs": ["10.20.0.0/16"]})
    assert spec.delivery.stream_url_secret_ref is not None
    assert (spec.delivery.stream_url_secret_ref.name, spec.delivery.stream_allowed_cidrs) == (
        "events-redis",
        ("10.20.0.0/16",),
    )
    items = by_kind_name(rendered(spec))
    env = env_of(items["StatefulSet", "orders-service"])
    # the URL and its password reach the pods through the kubelet, never topic.json
    assert env["DELAYQ_STREAM_URL"] == {"secretKeyRef": {"name": "events-redis", "key": "url"}}
    assert "events-redis" not in items["ConfigMap", "orders-config"]["data"][naming.CONFIG_KEY]
    # no reader on broker 0: nothing is written there
    assert ("Secret", READER) not in items
    assert ("NetworkPolicy", "orders-redis-readers") not in items
    assert "STREAM_READER_RULES" not in env_of(items["StatefulSet", "orders-redis-0"])


def test_an_external_targets_egress_is_public_plus_its_cidrs() -> None:
    *_, target = egress_of(stream_spec({**EXTERNAL, "allowedCidrs": ["10.20.1.1/16"]}))
    assert target["ports"] == [{"protocol": "TCP"}]
    assert target["to"][0] == {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(NON_PUBLIC_IPV4)}}
    assert target["to"][2:] == [{"ipBlock": {"cidr": "10.20.0.0/16"}}]
    *_, everything = egress_of(stream_spec({**EXTERNAL, "allowPrivateTargets": True}))
    assert everything["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
    # broker 0 as the target: DNS, the topic's Redis and ZooKeeper only
    assert len(egress_of(stream_spec())) == 3


@pytest.mark.parametrize(
    "stream",
    [{"allowedCidrs": ["10.0.0.0/8"]}, {"allowPrivateTargets": True}],
    ids=["cidrs", "private"],
)
def test_target_addresses_without_an_external_target_are_refused(stream: dict[str, Any]) -> None:
    with pytest.raises(SpecError) as caught:
        stream_spec(stream)
    assert str(caught.value) == STREAM_TARGETS_WITHOUT_URL_MESSAGE


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ({"name": "Bad_Name", "key": "url"}, r"delivery\.stream\.urlSecretRef\.name: a Secret"),
        ({"name": "events"}, r"delivery\.stream\.urlSecretRef\.key is required"),
        ("events/url", r"delivery\.stream\.urlSecretRef must be an object"),
    ],
)
def test_bad_url_secret_references_name_the_field(ref: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        stream_spec({"urlSecretRef": ref})


def test_the_platform_caps_an_external_targets_addresses() -> None:
    policy = TenantPolicy(allowed_cidrs=parse_cidrs(["10.20.0.0/16"]))
    inside = stream_spec({**EXTERNAL, "allowedCidrs": ["10.20.3.0/24"]})
    assert policy.refusal(inside.delivery) is None
    outside = stream_spec({**EXTERNAL, "allowedCidrs": ["10.30.0.0/24"]})
    refusal = policy.refusal(outside.delivery)
    assert refusal is not None
    assert refusal.startswith("spec.delivery.stream.allowedCidrs[0] 10.30.0.0/24 is outside")
    private = stream_spec({**EXTERNAL, "allowPrivateTargets": True})
    refusal = policy.refusal(private.delivery)
    assert refusal is not None
    assert refusal.startswith("spec.delivery.stream.allowPrivateTargets: true is not allowed")
    assert TenantPolicy(allow_private_targets=True).refusal(private.delivery) is None


def test_broker_0_holds_the_reader_user_of_the_target_stream_only() -> None:
    spec = stream_spec({"streamKey": "orders:due"}, brokers=2)
    items = by_kind_name(rendered(spec))
    env = env_of(items["StatefulSet", "orders-redis-0"])
    assert env["STREAM_READER_USER"] == acl.STREAM_READER_USER
    assert env["STREAM_READER_RULES"].split() == acl.stream_reader_rules("orders:due")
    assert [r for r in env["STREAM_READER_RULES"].split() if r.startswith("~")] == ["~orders:due"]
    assert env["STREAM_READER_PASSWORD"] == {
        "secretKeyRef": {"name": READER, "key": naming.SECRET_STREAM_READER_PASSWORD}
    }
    assert (
        not {"STREAM_READER_RULES", "STREAM_READER_PASSWORD"}
        & env_of(items["StatefulSet", "orders-redis-1"]).keys()
    )  # the stream is on broker 0: no reader anywhere else
    assert "DELAYQ_STREAM_URL" not in env_of(items["StatefulSet", "orders-service"])


def test_the_reader_rules_grant_no_write_and_no_other_key() -> None:
    rules = acl.stream_reader_rules("dq-out:shop/orders")
    assert rules[:5] == ["reset", "on", "~dq-out:shop/orders", "resetchannels", "-@all"]
    granted = {rule[1:] for rule in rules[5:]}
    assert all(rule.startswith("+") for rule in rules[5:])
    assert not granted & {"xadd", "xdel", "xtrim", "del", "unlink", "xgroup", "xgroup|destroy"}


def test_the_reader_secret_holds_a_login_to_broker_0s_master() -> None:
    spec = stream_spec()
    manifests = render(OWNER, spec, CTX, WITH_READER, spec.slot_amount, False)
    secret = by_kind_name(manifests)["Secret", READER]
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data[naming.SECRET_STREAM_READER_USERNAME] == acl.STREAM_READER_USER
    url = urlsplit(data[naming.SECRET_STREAM_READER_URL])
    assert (url.scheme, url.username, url.hostname, url.port, url.path) == (
        "redis",
        acl.STREAM_READER_USER,
        "orders-redis-0.shop.svc",
        naming.REDIS_PORT,
        "/0",
    )
    assert url.password == "r%2Fp%40ss"  # quoted: redis-py unquotes it
    assert data[naming.SECRET_STREAM_READER_PASSWORD] == "r/p@ss"
    # the Secret and the policy come before the Redis pods that read them
    kinds = [(m["kind"], m["metadata"]["name"]) for m in manifests]
    assert kinds.index(("Secret", READER)) < kinds.index(("StatefulSet", "orders-redis-0"))
    assert secret["metadata"]["ownerReferences"]  # deleted with the topic


def test_allow_from_peers_reach_broker_0s_redis_port_only() -> None:
    spec = stream_spec(brokers=2, networkPolicy={"allowFrom": [CONSUMERS]})
    policy = by_kind_name(rendered(spec))["NetworkPolicy", "orders-redis-readers"]
    assert policy["spec"]["podSelector"]["matchLabels"] == naming.redis_selector("orders", 0)
    assert policy["spec"]["ingress"] == [
        {"from": [CONSUMERS], "ports": [{"protocol": "TCP", "port": naming.REDIS_PORT}]}
    ]
    # the topic's own Redis policy is unchanged: the peers reach no other broker
    redis_policy = by_kind_name(rendered(spec))["NetworkPolicy", "orders-redis"]
    assert CONSUMERS not in redis_policy["spec"]["ingress"][0]["from"]


def test_without_allow_from_the_reader_policy_admits_nobody_and_changes_are_patched() -> None:
    """An ingress rule without `from` admits every pod: an empty list renders no rule at all,
    and the hash annotation makes a removed peer a patch (apply.contains cannot see it)."""
    empty = by_kind_name(rendered(stream_spec()))["NetworkPolicy", "orders-redis-readers"]
    assert empty["spec"]["ingress"] == []
    with_peer = by_kind_name(rendered(stream_spec(networkPolicy={"allowFrom": [CONSUMERS]})))[
        "NetworkPolicy", "orders-redis-readers"
    ]
    hashes = {
        policy["metadata"]["annotations"][naming.POLICY_HASH_ANNOTATION]
        for policy in (empty, with_peer)
    }
    assert len(hashes) == 2


async def test_narrowing_allow_from_patches_the_reader_policy(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    other = {"podSelector": {"matchLabels": {"app": "audit"}}}
    stream: dict[str, Any] = {"topicType": "stream", "replicasPerBroker": 0}
    put_topic(api, **stream, networkPolicy={"allowFrom": [CONSUMERS, other]})
    await provision(api, ctx, logger)
    update_spec(api, **stream, networkPolicy={"allowFrom": [CONSUMERS]})
    await provision(api, ctx, logger)
    assert existing(api, POLICIES, READERS)["spec"]["ingress"][0]["from"] == [CONSUMERS]
    update_spec(api, **stream, networkPolicy={"allowFrom": []})
    await provision(api, ctx, logger)
    assert existing(api, POLICIES, READERS)["spec"]["ingress"] == []


@pytest.mark.parametrize(
    "elsewhere",
    [
        {"topicType": "stream", "delivery": {"stream": EXTERNAL}},
        {"topicType": "pull", "delivery": {"stream": None}},
    ],
    ids=["external-target", "pull-topic"],
)
async def test_a_topic_no_longer_read_on_broker_0_loses_the_readers_policy_and_login(
    api: kmock.KubernetesEmulator,
    ctx: OperatorContext,
    logger: logging.Logger,
    elsewhere: dict[str, Any],
) -> None:
    """The policy would keep admitting the former consumers to broker 0's Redis port. The
    Secret stays until the topic goes (the operator may not read or delete Secrets in the
    tenant's namespace), holding a login the next broker-0 pods no longer have."""
    allow: dict[str, Any] = {"networkPolicy": {"allowFrom": [CONSUMERS]}, "replicasPerBroker": 0}
    put_topic(api, topicType="stream", delivery={"stream": {}}, **allow)
    await provision(api, ctx, logger)
    first = existing(api, SECRETS, READER)["data"][naming.SECRET_STREAM_READER_PASSWORD]
    assert get(api, POLICIES, READERS) is not None
    update_spec(api, **elsewhere, **allow)
    await provision(api, ctx, logger)
    assert existing(api, SECRETS, READER)["data"][naming.SECRET_STREAM_READER_PASSWORD] == first
    assert get(api, POLICIES, READERS) is None
    assert "STREAM_READER_RULES" not in env_of(existing(api, STS, "orders-redis-0"))
    deletes = [r for r in list(api) if r.method.value == "DELETE"]
    assert [str(r.name) for r in deletes] == [READERS]
    await provision(api, ctx, logger)  # nothing left to delete: no further DELETE
    assert len([r for r in list(api) if r.method.value == "DELETE"]) == 1
    # back on broker 0: a new login, which the rolled pods of broker 0 read
    update_spec(api, topicType="stream", delivery={"stream": {"urlSecretRef": None}}, **allow)
    await provision(api, ctx, logger)
    assert existing(api, SECRETS, READER)["data"][naming.SECRET_STREAM_READER_PASSWORD] != first
    assert get(api, POLICIES, READERS) is not None


async def test_a_secret_of_that_name_the_topic_does_not_own_is_kept(
    api: kmock.KubernetesEmulator, ctx: OperatorContext, logger: logging.Logger
) -> None:
    """A tenant may name its own external target's Secret `<t>-stream-reader`."""
    url = base64.b64encode(b"rediss://u:p@events:6380/0").decode()
    api.objects[SECRETS, NAMESPACE, READER] = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": READER, "namespace": NAMESPACE},
        "data": {"url": url},
    }
    ref = {"urlSecretRef": {"name": READER, "key": "url"}}
    put_topic(api, topicType="stream", delivery={"stream": ref}, replicasPerBroker=0)
    await provision(api, ctx, logger)
    assert existing(api, SECRETS, READER)["data"] == {"url": url}
    assert body(api)["metadata"]["uid"]  # the owner the check compares with


@pytest.mark.parametrize("url", ["http://redis:6379", "redis-host:6379", "events"])
def test_serve_refuses_a_stream_url_it_cannot_connect_to_without_echoing_it(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ServiceConfig(topic_type="stream", stream_url=url)  # type: ignore[arg-type]
    assert str(caught.value) == (
        "--stream-url (DELAYQ_STREAM_URL) must start with redis://, rediss:// or unix://"
    )
