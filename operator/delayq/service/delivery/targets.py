"""Which resolved addresses a webhook may be POSTed to: the SSRF guard's decision (pure).

A tenant chooses its topic's webhook URL, and the delay-service pod POSTs to it from inside the
cluster, so without a check a URL could reach what only the platform should: loopback, the
cloud metadata address (169.254.169.254, link-local), cluster-internal Services and pods
(RFC 1918, fc00::/7, CGNAT 100.64.0.0/10). `TargetPolicy.refusal` decides on an address as it
was resolved — the one the connection will use (the webhook sink's resolver calls it, see
`webhook.py`), never on the name, which DNS may answer differently a moment later.

An IPv6 address that carries an IPv4 one (mapped `::ffff:a.b.c.d`, NAT64 `64:ff9b::/96`) is
judged by the IPv4 address it reaches. A topic admits such addresses with `allow_private`
(everything) or `allowed` (just those CIDRs, the narrower choice).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Shared address space (RFC 6598): carrier NAT, and in many clusters the pod or Service range.
CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
#: The well-known NAT64 prefix (RFC 6052): a gateway translates it to the embedded IPv4 address.
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
#: What the settings' values look like; the parser adds the exact check.
CIDR_EXAMPLE = "10.0.0.0/8 or fd00::/8"
ADMIT_HINT = "allow it with webhook allowedCidrs or allowPrivateTargets"


@dataclass(frozen=True)
class TargetPolicy:
    """A topic's answer to "may a webhook POST go to this address?"."""

    allow_private: bool = False
    allowed: tuple[Network, ...] = ()

    def refusal(self, address: str) -> str | None:
        """None when `address` (an IP as resolved, maybe with an IPv6 scope) may be connected
        to; else why not, naming the address and how a topic admits it."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return f"webhook target {address!r} refused: not an IP address"
        if self.allow_private:
            return None
        reached = embedded_ipv4(ip) or ip
        if any(candidate in network for candidate in {ip, reached} for network in self.allowed):
            return None
        kind = category(reached)
        if kind is None:
            return None
        return f"webhook target {address} refused: {kind} address ({ADMIT_HINT})"


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


def embedded_ipv4(ip: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one leads to (mapped or NAT64), None for any other."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return None
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip in NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


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
