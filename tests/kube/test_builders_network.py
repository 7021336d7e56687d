"""The network policies a topic renders: who reaches the service pods and the brokers, the
service pods' egress (DNS, their Redis, the platform's ZooKeeper, public webhook addresses),
and `allowFrom` as written or refused naming the entry."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from typing import Any

import pytest

from delayq.kube import naming
from delayq.kube.apply import contains, update_patch
from delayq.kube.builders.bundle import render
from delayq.kube.builders.service import NON_PUBLIC_IPV4, NON_PUBLIC_IPV6
from delayq.kube.ensembles import EnsembleRefused
from delayq.kube.spec import (
    ALLOW_FROM_EMPTY_PEER_MESSAGE,
    ALLOW_FROM_IP_BLOCK_ALONE_MESSAGE,
    SpecError,
)
from delayq.service.delivery.targets import TargetPolicy
from tests.kube.manifests import (
    CREDS,
    CTX,
    OWNER,
    WEBHOOK,
    by_kind_name,
    egress_of,
    rendered,
    service_policy,
    spec_of,
)


def test_network_policy_admits_only_service_pods_redis_peers_backups_and_operator() -> None:
    policy = by_kind_name(rendered())["NetworkPolicy", "orders-redis"]["spec"]
    assert policy["podSelector"]["matchLabels"] == naming.redis_selector("orders")
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
    peers = rule["from"]
    assert peers[0] == {"podSelector": {"matchLabels": naming.service_selector("orders")}}
    assert peers[1] == {"podSelector": {"matchLabels": naming.redis_selector("orders")}}
    assert peers[2] == {"podSelector": {"matchLabels": naming.backup_selector("orders")}}
    assert peers[3]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ops"}
    assert peers[3]["podSelector"]["matchLabels"] == naming.OPERATOR_POD_LABELS
    assert len(peers) == 4


PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def test_service_network_policy_selects_the_service_pods_both_ways() -> None:
    items = by_kind_name(rendered())
    policy = items["NetworkPolicy", "orders-service"]["spec"]
    template = items["StatefulSet", "orders-service"]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= template.items()
    assert policy["podSelector"]["matchLabels"] == naming.service_selector("orders")
    assert policy["policyTypes"] == ["Ingress", "Egress"]


def test_service_api_admits_the_namespace_the_operator_and_allow_from_peers() -> None:
    (rule,) = service_policy(spec_of())["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": naming.SERVICE_HTTP_PORT}]
    namespace, operator = rule["from"]
    assert namespace == {"podSelector": {}}  # no namespaceSelector: the policy's namespace
    assert operator["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "ops"}
    assert operator["podSelector"]["matchLabels"] == naming.OPERATOR_POD_LABELS
    block = {"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.128/25"]}}
    spec = spec_of(networkPolicy={"allowFrom": [PROMETHEUS, block]})
    (rule,) = service_policy(spec)["spec"]["ingress"]
    assert rule["from"][2:] == [PROMETHEUS, block]
    assert rule["ports"] == [{"protocol": "TCP", "port": naming.SERVICE_HTTP_PORT}]


def test_allow_from_ip_blocks_reach_the_policy_normalized() -> None:
    """The API server rejects host bits in an ipBlock; the tenant's text is normalized."""
    block = {"ipBlock": {"cidr": "203.0.113.7/24", "except": ["203.0.113.200/25"]}}
    (rule,) = service_policy(spec_of(networkPolicy={"allowFrom": [block]}))["spec"]["ingress"]
    assert rule["from"][2:] == [
        {"ipBlock": {"cidr": "203.0.113.0/24", "except": ["203.0.113.128/25"]}}
    ]


@pytest.mark.parametrize("topic_type", ["pull", "stream"])
def test_service_egress_is_dns_its_redis_and_zookeeper_only(topic_type: str) -> None:
    items = by_kind_name(rendered(spec_of(topicType=topic_type)))
    dns, redis, zookeeper = egress_of(spec_of(topicType=topic_type))
    assert dns == {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
    (peer,) = redis["to"]
    redis_pods = items["StatefulSet", "orders-redis-0"]["spec"]["template"]["metadata"]["labels"]
    assert peer["podSelector"]["matchLabels"].items() <= redis_pods.items()
    assert "namespaceSelector" not in peer  # the topic's own namespace only
    assert redis["ports"] == [{"protocol": "TCP", "port": naming.REDIS_PORT}]
    assert zookeeper == {"ports": [{"protocol": "TCP", "port": 2181}]}  # CTX's default


PLATFORM_ZK = "zk-0:2281,zk-1:2281,zk-2:2282/delayq"


@pytest.mark.parametrize("connect", ["zk-1:2281", "ZK-2:2282,zk-0:2281"])
def test_zookeeper_egress_and_connect_are_the_platforms_ensemble_a_topic_selects(
    connect: str,
) -> None:
    """The tenant's hosts select an allowed ensemble; its ports, hosts and chroot are used."""
    build = dataclasses.replace(CTX, zookeeper_allowed_ensembles=(PLATFORM_ZK,))
    spec = spec_of(zookeeper={"connect": connect})
    items = by_kind_name(render(OWNER, spec, build, CREDS, 8, False))
    zookeeper = items["NetworkPolicy", "orders-service"]["spec"]["egress"][2]
    assert zookeeper == {"ports": [{"protocol": "TCP", "port": p} for p in (2281, 2282)]}
    config = json.loads(items["ConfigMap", "orders-config"]["data"]["topic.json"])
    assert config["zookeeper_connect"] == PLATFORM_ZK


@pytest.mark.parametrize(
    "connect",
    [
        "169.254.169.254:80,zk-0:2281",  # a port of the metadata endpoint beside a real host
        "zk-0:2281,zookeeper.elsewhere:2281",  # two ensembles' hosts
        "zk-0:2182",  # a port of the platform's host the platform does not use
    ],
)
def test_a_connection_string_outside_the_platforms_ensembles_renders_nothing(
    connect: str,
) -> None:
    build = dataclasses.replace(CTX, zookeeper_allowed_ensembles=(PLATFORM_ZK,))
    with pytest.raises(EnsembleRefused, match=r"names a host of no ZooKeeper ensemble"):
        render(OWNER, spec_of(zookeeper={"connect": connect}), build, CREDS, 8, False)


def test_zookeeper_connect_ports_must_be_tcp_ports() -> None:
    with pytest.raises(SpecError, match=r"zookeeper\.connect port 99999 must be between 1 and"):
        spec_of(zookeeper={"connect": "zk:99999"})


def test_webhook_egress_reaches_public_addresses_only() -> None:
    *_, webhook = egress_of(spec_of(topicType="webhook", delivery={"webhook": WEBHOOK}))
    assert webhook["ports"] == [{"protocol": "TCP"}]
    v4, v6 = webhook["to"]
    assert v4 == {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(NON_PUBLIC_IPV4)}}
    assert v6 == {"ipBlock": {"cidr": "::/0", "except": list(NON_PUBLIC_IPV6)}}
    assert set(v4["ipBlock"]["except"]) == {
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "127.0.0.0/8",
        "100.64.0.0/10",
    }
    assert set(v6["ipBlock"]["except"]) == {"fc00::/7", "fe80::/10", "64:ff9b::/96"}


def test_the_excepted_ranges_are_ones_the_ssrf_guard_refuses() -> None:
    """The policy is the guard's second line: it must not except what the guard would allow
    (a public range), or the two would disagree about where a webhook may go."""
    guard = TargetPolicy()
    for cidr in NON_PUBLIC_IPV4 + NON_PUBLIC_IPV6:
        network = ipaddress.ip_network(cidr)
        for address in (network[1], network[-2]):
            assert guard.refusal(str(address)) is not None, address


def test_webhook_egress_follows_allow_private_targets_and_allowed_cidrs() -> None:
    hook = {**WEBHOOK, "allowPrivateTargets": True}
    *_, webhook = egress_of(spec_of(topicType="webhook", delivery={"webhook": hook}))
    assert webhook["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
    hook = {**WEBHOOK, "allowedCidrs": ["10.96.0.1/12", "fd00::/8"]}
    *_, webhook = egress_of(spec_of(topicType="webhook", delivery={"webhook": hook}))
    assert webhook["to"][0]["ipBlock"]["except"] == list(NON_PUBLIC_IPV4)
    assert webhook["to"][2:] == [
        {"ipBlock": {"cidr": "10.96.0.0/12"}},  # host bits cleared: a policy needs a network
        {"ipBlock": {"cidr": "fd00::/8"}},
    ]


def test_a_loosened_service_policy_is_still_patched() -> None:
    """apply.contains() ignores fields the existing object has beyond the desired ones, so
    dropping the `except` (allowPrivateTargets turned on) would look unchanged without the
    policy hash annotation, and the webhook would stay blocked."""
    closed = service_policy(spec_of(topicType="webhook", delivery={"webhook": WEBHOOK}))
    hook = {**WEBHOOK, "allowPrivateTargets": True}
    opened = service_policy(spec_of(topicType="webhook", delivery={"webhook": hook}))
    assert contains(closed["spec"], opened["spec"])  # what the hash is for
    assert not contains(closed, update_patch(opened))
    assert contains(closed, update_patch(closed))


@pytest.mark.parametrize(
    ("allow_from", "message"),
    [
        ("monitoring", r"networkPolicy\.allowFrom must be a list of at most 32"),
        ([{}] * 33, r"networkPolicy\.allowFrom must be a list of at most 32"),
        (["monitoring"], r"allowFrom\[0\] must be an object"),
        ([PROMETHEUS, {}], r"allowFrom\[1\]: " + re.escape(ALLOW_FROM_EMPTY_PEER_MESSAGE)),
        (
            [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}],
            r"allowFrom\[0\]: " + re.escape(ALLOW_FROM_IP_BLOCK_ALONE_MESSAGE),
        ),
        ([{"namespace": "monitoring"}], r"allowFrom\[0\]: unknown field 'namespace'"),
        ([{"podSelector": {"app": "x"}}], r"allowFrom\[0\]\.podSelector: unknown field 'app'"),
        (
            [{"podSelector": {"matchLabels": {"app": 1}}}],
            r"allowFrom\[0\]\.podSelector\.matchLabels must map label names to string",
        ),
        (
            [{"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}}],
            r"allowFrom\[0\]\.namespaceSelector\.matchExpressions\[0\]\.operator 'Is'",
        ),
        (
            [{"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}],
            r"matchExpressions\[0\]\.values must be non-empty for In",
        ),
        ([{"ipBlock": {"cidr": "10.0.0.0/33"}}], r"allowFrom\[0\]\.ipBlock\.cidr: '10.0.0.0/33'"),
        (
            [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["192.168.0.0/16"]}}],
            r"allowFrom\[0\]\.ipBlock\.except\[0\] '192.168.0.0/16' must lie strictly inside",
        ),
        (
            [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["fd00::/8"]}}],
            r"allowFrom\[0\]\.ipBlock\.except\[0\] 'fd00::/8' must lie strictly inside",
        ),
    ],
)
def test_bad_allow_from_entries_are_named(allow_from: Any, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        spec_of(networkPolicy={"allowFrom": allow_from})


def test_allow_from_selectors_are_kept_as_written() -> None:
    every_namespace: dict[str, Any] = {"namespaceSelector": {}}
    expression = {
        "namespaceSelector": {
            "matchExpressions": [
                {"key": "team", "operator": "In", "values": ["ops"]},
                {"key": "legacy", "operator": "DoesNotExist"},
            ]
        }
    }
    spec = spec_of(networkPolicy={"allowFrom": [every_namespace, expression]})
    assert spec.network_policy_allow_from == (every_namespace, expression)
