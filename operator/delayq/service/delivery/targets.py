"""Which resolved addresses a webhook or stream target may reach: the SSRF guard's decision.

A tenant chooses its topic's webhook URL, and the delay-service pod POSTs to it from inside the
cluster, so without a check a URL could reach what only the platform should: loopback, the
cloud metadata address (169.254.169.254, link-local), cluster-internal Services and pods
(RFC 1918, fc00::/7, CGNAT 100.64.0.0/10). `TargetPolicy.refusal` decides on an address as it
was resolved — the one the connection will use (`admitted_addresses`, which the webhook client
and the stream target connect through), never on the name, which DNS may answer differently a
moment later.

An IPv6 address of a transition mechanism is judged by the IPv4 address(es) it carries, since
a gateway, relay or the kernel turns it into that IPv4 destination: IPv4-mapped `::ffff:0:0/96`,
IPv4-compatible `::/96`, 6to4 `2002::/16`, Teredo `2001::/32` (both the server's and the
client's address), NAT64 `64:ff9b::/96` and the local-use NAT64 `64:ff9b:1::/48`, whose prefix
length the network chooses (RFC 8215): every RFC 6052 layout it may use is checked, and one
non-public reading refuses it. A topic admits such addresses with `allow_private` (everything)
or `allowed` (just those CIDRs, the narrower choice; the IPv6 address or each IPv4 it carries).

The same policy guards a stream topic's external Redis (`stream.py`), `subject` naming which.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Shared address space (RFC 6598): carrier NAT, and in many clusters the pod or Service range.
CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
#: The well-known NAT64 prefix (RFC 6052): a gateway translates it to the embedded IPv4 address.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
#: The local-use NAT64 prefix (RFC 8215), used with any RFC 6052 prefix length from /48 on.
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
#: Where RFC 6052 puts the IPv4 address for a prefix of /48, /56, /64 and /96: its bit offset
#: in the address without the reserved bits 64-71 (the "u" octet).
NAT64_LOCAL_OFFSETS = (48, 56, 64, 88)
#: IPv4-compatible addresses (RFC 4291, deprecated): `::a.b.c.d`, `::` and `::1` excepted.
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")
#: What the settings' values look like; the parser adds the exact check.
CIDR_EXAMPLE = "10.0.0.0/8 or fd00::/8"


Resolve = Callable[[str, int], Awaitable[list[str]]]  # host, port -> its addresses


class TargetRefusedError(OSError):
    """Every address of a target host is refused. An OSError, because that is what redis-py
    turns into a `ConnectionError` naming the host."""


async def system_resolve(host: str, port: int) -> list[str]:
    """The host's addresses from the C library, as `connect` would read them (an IP literal
    in any form it accepts, `127.1` too, is answered without DNS)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


async def admitted_addresses(
    host: str, port: int, policy: TargetPolicy, resolve: Resolve = system_resolve
) -> list[str]:
    """The addresses `host` resolves to that `policy` admits, in the resolver's order: the
    only ones to connect to. TargetRefusedError naming the first refusal when none is."""
    admitted: list[str] = []
    refusals: list[str] = []
    for address in await resolve(host, port):
        refused = policy.refusal(address)
        if refused is None:
            admitted.append(address)
        else:
            refusals.append(refused)
    if not admitted:
        raise TargetRefusedError(f"{host}: {refusals[0] if refusals else 'no address'}")
    return admitted


@dataclass(frozen=True)
class TargetPolicy:
    """A topic's answer to "may a webhook POST (or a stream write) go to this address?"."""

    allow_private: bool = False
    allowed: tuple[Network, ...] = ()
    #: which target the messages name: "webhook", or "stream" for an external stream target
    subject: str = "webhook"

    def refusal(self, address: str) -> str | None:
        """None when `address` (an IP as resolved, maybe with an IPv6 scope) may be connected
        to; else why not, naming the address and how a topic admits it."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return f"{self.subject} target {address!r} refused: not an IP address"
        if self.allow_private or any(ip in network for network in self.allowed):
            return None
        for reached in embedded_ipv4s(ip) or (ip,):
            kind = category(reached)
            if kind is None or any(reached in network for network in self.allowed):
                continue
            via = "" if reached is ip else f" (it reaches {reached})"
            return (
                f"{self.subject} target {address} refused: {kind} address{via} "
                f"(allow it with {self.subject} allowedCidrs or allowPrivateTargets)"
            )
        return None


def category(ip: Address) -> str | None:
    """Why `ip` is not a public address (None: it is). The order names the most specific
    reason; anything not globally routable that is none of the others counts as private."""
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    site_local = isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local
    if ip.is_private or site_local or ip in CGNAT or not ip.is_global:
        return "private"
    return None


def embedded_ipv4s(ip: Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 one of a transition mechanism may lead to; () for any other
    address (an IPv4 one, or a native IPv6 one, judged as itself)."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return ()
    if ip.ipv4_mapped is not None:
        return (ip.ipv4_mapped,)
    if ip.sixtofour is not None:
        return (ip.sixtofour,)
    if ip.teredo is not None:
        return ip.teredo  # (server, client): the client's address is deobfuscated
    if ip in NAT64:
        return (_ipv4_at(int(ip), 96),)
    if ip in NAT64_LOCAL:
        without_u = (int(ip) >> 64 << 56) | (int(ip) & (1 << 56) - 1)  # 120 bits
        return tuple(_ipv4_at(without_u, offset + 8) for offset in NAT64_LOCAL_OFFSETS)
    if ip in IPV4_COMPATIBLE and int(ip) > 1:
        return (_ipv4_at(int(ip), 96),)
    return ()


def _ipv4_at(bits: int, offset: int) -> ipaddress.IPv4Address:
    """The 32 bits of a 128-bit value starting at `offset` (counted from the top)."""
    return ipaddress.IPv4Address(bits >> (128 - offset - 32) & 0xFFFFFFFF)


def parse_cidrs(values: Iterable[str]) -> tuple[Network, ...]:
    """Each value as a network; a ValueError names the first that is not `address/prefix`.

    Host bits are allowed (`10.1.2.3/8` is `10.0.0.0/8`), as the API server's `cidr()` does."""
    networks: list[Network] = []
    for value in values:
        try:
            if "/" not in value:
                raise ValueError("no prefix length")
            networks.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"{value!r} is not a CIDR such as {CIDR_EXAMPLE}") from None
    return tuple(networks)


def split_cidrs(text: str) -> list[str]:
    """A comma-separated list (the `webhook_allowed_cidrs` setting) as its items."""
    return [item.strip() for item in text.split(",") if item.strip()]
