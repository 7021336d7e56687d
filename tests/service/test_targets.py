"""The webhook SSRF guard's decision on resolved addresses (pure), and the client applying it."""

from __future__ import annotations

import re

import pytest

from delayq.service.delivery.http_post import PostClient
from delayq.service.delivery.targets import (
    TargetPolicy,
    TargetRefusedError,
    parse_cidrs,
    split_cidrs,
)
from tests.service.receiver_support import Receiver, answers

REFUSED = [
    ("127.0.0.1", "loopback"),
    ("127.8.9.10", "loopback"),
    ("::1", "loopback"),
    ("169.254.169.254", "link-local"),  # the cloud metadata address
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),  # as getaddrinfo reports a scoped address
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),
    ("10.0.0.5", "private"),
    ("172.16.3.4", "private"),
    ("192.168.1.1", "private"),
    ("100.64.0.1", "private"),  # CGNAT, often a cluster's pod range
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    ("192.0.2.1", "private"),  # documentation range: not globally routable
    ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped: judged by the IPv4 address
    ("::ffff:169.254.169.254", "link-local"),
    ("::ffff:10.0.0.5", "private"),
    ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
    # every other IPv6 transition prefix: judged by the IPv4 address it carries
    ("2002:7f00:1::", "loopback"),  # 6to4 of 127.0.0.1
    ("2002:a9fe:a9fe::1", "link-local"),  # 6to4 of the metadata address
    ("2002:a00:5::", "private"),  # 6to4 of 10.0.0.5
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "loopback"),  # Teredo, client 127.0.0.1
    ("2001:0:a00:5::f7f7:f7f7", "private"),  # Teredo, server 10.0.0.5
    ("2001:0:808:808:0:0:5601:5601", "link-local"),  # Teredo, client 169.254.169.254
    ("64:ff9b:1::a9fe:a9fe", "unspecified"),  # local-use NAT64 (/48 layout: 0.0.0.0)
    ("64:ff9b:1:a9fe:a9:fe00::", "link-local"),  # local-use NAT64, /48 layout
    ("64:ff9b:1:808:8:a9fe:a9fe:0", "link-local"),  # 8.8.8.8 as /48, the metadata as /96
    ("::7f00:1", "loopback"),  # IPv4-compatible 127.0.0.1
    ("::a9fe:a9fe", "link-local"),
]
PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "2606:4700::1111",
    "::ffff:8.8.8.8",
    "64:ff9b::808:808",
    "2002:808:808::1",  # 6to4 of a public address
    "2001:0:808:808:0:0:f7f7:f7f7",  # Teredo, server and client 8.8.8.8
    "::808:808",  # IPv4-compatible 8.8.8.8
]


@pytest.mark.parametrize(("address", "kind"), REFUSED)
def test_every_non_public_category_is_refused_with_a_reason_naming_it(address: str, kind: str):
    reason = TargetPolicy().refusal(address)
    assert reason is not None
    assert reason.startswith(f"webhook target {address} refused: {kind} address")
    assert "allowPrivateTargets" in reason
    assert "allowedCidrs" in reason


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_admitted(address: str):
    assert TargetPolicy().refusal(address) is None


@pytest.mark.parametrize(("address", "kind"), REFUSED)
def test_allow_private_admits_everything(address: str, kind: str):
    assert TargetPolicy(allow_private=True).refusal(address) is None


def test_a_transition_address_is_refused_naming_the_ipv4_it_reaches():
    reason = str(TargetPolicy().refusal("2002:a9fe:a9fe::1"))
    assert "link-local address (it reaches 169.254.169.254)" in reason


def test_the_allow_list_admits_a_transition_address_by_the_ipv4_it_carries():
    policy = TargetPolicy(allowed=parse_cidrs(["10.96.0.0/12"]))
    assert policy.refusal("2002:a60:1::") is None  # 6to4 of 10.96.0.1
    assert policy.refusal("2002:a00:5::") is not None  # 6to4 of 10.0.0.5


def test_a_stream_policy_names_the_stream_settings():
    reason = str(TargetPolicy(subject="stream").refusal("127.0.0.1"))
    assert reason.startswith("stream target 127.0.0.1 refused: loopback address")
    assert "stream allowedCidrs or allowPrivateTargets" in reason


def test_the_allow_list_admits_its_networks_only():
    policy = TargetPolicy(allowed=parse_cidrs(["10.96.0.0/12", "fd00::/8", "127.0.0.1/32"]))
    for admitted in ("10.96.0.10", "10.111.255.255", "fd00::5", "127.0.0.1", "::ffff:10.96.0.1"):
        assert policy.refusal(admitted) is None, admitted
    for refused in ("10.95.255.255", "10.0.0.5", "169.254.169.254", "127.0.0.2", "fc00::1"):
        assert policy.refusal(refused) is not None, refused


def test_something_that_is_not_an_address_is_refused():
    assert "not an IP address" in str(TargetPolicy(allow_private=True).refusal("example.com"))


def test_cidrs_are_parsed_strictly_but_accept_host_bits():
    assert [str(n) for n in parse_cidrs(split_cidrs(" 10.1.2.3/8 , fd00::/8,"))] == [
        "10.0.0.0/8",
        "fd00::/8",
    ]
    for bad in ("10.0.0.0/33", "10.0.0.1", "office-lan", "fd00::/129", ""):
        with pytest.raises(ValueError, match="is not a CIDR"):
            parse_cidrs([bad])


async def test_the_client_drops_refused_addresses_and_connects_to_a_checked_one():
    """The name resolves to a private, a link-local and a loopback address; only loopback is
    allowed, so that is the one connected to, and the POST still names the URL's host."""
    async with Receiver() as receiver:
        client = PostClient(
            f"http://hooks.example.com:{receiver.port}/hook",
            TargetPolicy(allowed=parse_cidrs(["127.0.0.0/8"])),
            5_000,
            resolve=answers("10.0.0.5", "169.254.169.254", "127.0.0.1"),
        )
        try:
            reply = await client.post(b"{}", {}, 1024)
        finally:
            await client.close()
    assert reply.status == 200
    assert receiver.requests[0].headers["host"] == f"hooks.example.com:{receiver.port}"


async def test_an_address_that_refuses_the_connection_gives_way_to_the_next():
    async with Receiver() as receiver:
        client = PostClient(
            f"http://hooks.example.com:{receiver.port}/hook",
            TargetPolicy(allowed=parse_cidrs(["127.0.0.0/8"])),
            5_000,
            resolve=answers("127.0.0.2", "127.0.0.1"),  # nothing listens on 127.0.0.2
        )
        try:
            assert (await client.post(b"{}", {}, 1024)).status == 200
        finally:
            await client.close()


async def test_a_name_with_only_refused_addresses_is_refused():
    client = PostClient(
        "http://rebind.example/hook", TargetPolicy(), 5_000, resolve=answers("169.254.169.254")
    )
    expected = "rebind.example: webhook target 169.254.169.254 refused: link-local"
    with pytest.raises(TargetRefusedError, match=re.escape(expected)):
        await client.post(b"{}", {}, 1024)
    assert client.connections == 0


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("http://127.0.0.1:8080/hook", "loopback"),
        ("http://[::ffff:127.0.0.1]/hook", "loopback"),
        ("http://169.254.169.254/latest/", "link-local"),
        ("http://127.1/hook", "loopback"),
        ("http://2130706433/hook", "loopback"),  # 127.0.0.1 as one number
        ("http://012.0.0.1/hook", "private"),  # octal: 10.0.0.1
        ("http://0x7f.1/hook", "loopback"),
    ],
)
async def test_an_ip_literal_is_checked_as_connect_would_read_it(url: str, refused: str):
    """The C library's IPv4 shorthands are addresses to `connect`: they are resolved like any
    host, so the check sees the address the connection would go to."""
    client = PostClient(url, TargetPolicy(), 5_000)
    with pytest.raises(TargetRefusedError, match=refused):
        await client.post(b"{}", {}, 1024)
