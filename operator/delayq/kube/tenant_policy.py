"""The platform's cap on the non-public addresses a tenant's DelayTopic may reach (pure).

`spec.delivery.webhook.allowPrivateTargets` and `allowedCidrs` are fields of the tenant's own
topic: without a cap, any tenant could switch off, for its own pods, both the SSRF guard
(service/delivery/targets.py) and the exceptions of their egress policy, and POST to the
metadata address or other tenants' Services. An external stream target
(`spec.delivery.stream.urlSecretRef`) names its addresses with the same two fields, capped the
same way: they open the pods' egress policy to them. The platform team sets the cap (chart values
`tenantPolicy`, the operator's DELAYQ_TENANT_* variables); the reconcile refuses a topic that
asks for more before it applies anything, so no pod ever runs with a setting the platform does
not allow, and the running ones keep the settings they started with.

A topic's CIDR must lie inside one of the platform's, compared as written: an IPv4-mapped
IPv6 network (`::ffff:10.0.0.0/104`) is not inside `10.0.0.0/8` unless the platform lists it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network

from delayq.kube.spec import Delivery
from delayq.service.delivery.targets import Network, parse_cidrs, split_cidrs

ALLOW_PRIVATE_TARGETS_ENV = "DELAYQ_TENANT_ALLOW_PRIVATE_TARGETS"
ALLOWED_CIDRS_ENV = "DELAYQ_TENANT_ALLOWED_CIDRS"
#: The condition reason of a topic the cap refuses.
REFUSED_REASON = "TenantPolicyExceeded"


@dataclass(frozen=True)
class TenantPolicy:
    """What every tenant may admit: everything (`allow_private_targets`), or at most the
    non-public addresses inside `allowed_cidrs` (none by default)."""

    allow_private_targets: bool = False
    allowed_cidrs: tuple[Network, ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> TenantPolicy:
        """DELAYQ_TENANT_ALLOW_PRIVATE_TARGETS (true/false), DELAYQ_TENANT_ALLOWED_CIDRS (a
        comma-separated list); a ValueError names the variable and the bad entry."""
        flag = env.get(ALLOW_PRIVATE_TARGETS_ENV, "").strip().lower()
        if flag not in ("", "true", "false"):
            raise ValueError(f"{ALLOW_PRIVATE_TARGETS_ENV} must be true or false, not {flag!r}")
        try:
            cidrs = parse_cidrs(split_cidrs(env.get(ALLOWED_CIDRS_ENV, "")))
        except ValueError as error:
            raise ValueError(f"{ALLOWED_CIDRS_ENV}: {error}") from None
        return cls(allow_private_targets=flag == "true", allowed_cidrs=cidrs)

    def refusal(self, delivery: Delivery) -> str | None:
        """None when the topic's target settings (its webhook's, or its external stream
        target's) are within the cap; else which field asks for more than which platform limit
        (a sentence for the topic's condition)."""
        if self.allow_private_targets:
            return None
        targets = (
            ("webhook", delivery.webhook_allow_private_targets, delivery.webhook_allowed_cidrs),
            ("stream", delivery.stream_allow_private_targets, delivery.stream_allowed_cidrs),
        )
        for section, allow_private, cidrs in targets:
            if allow_private:
                return (
                    f"spec.delivery.{section}.allowPrivateTargets: true is not allowed by the "
                    "platform (tenantPolicy.allowPrivateTargets: false); use allowedCidrs within "
                    f"tenantPolicy.allowedCidrs ({self._limit()}) or ask the platform team."
                )
            # the spec parser has checked every entry already
            for index, network in enumerate(parse_cidrs(cidrs)):
                if not any(_inside(network, allowed) for allowed in self.allowed_cidrs):
                    return (
                        f"spec.delivery.{section}.allowedCidrs[{index}] {network} is outside the "
                        f"platform's tenantPolicy.allowedCidrs ({self._limit()}); narrow it or "
                        "ask the platform team."
                    )
        return None

    def _limit(self) -> str:
        return ", ".join(str(network) for network in self.allowed_cidrs) or "none"


def _inside(network: Network, allowed: Network) -> bool:
    """`network` is a subnet of `allowed` (never across IPv4 and IPv6)."""
    if isinstance(network, IPv4Network) and isinstance(allowed, IPv4Network):
        return network.subnet_of(allowed)
    if isinstance(network, IPv6Network) and isinstance(allowed, IPv6Network):
        return network.subnet_of(allowed)
    return False
