"""Reading the routing node as a delay service does at start, for tests of its access rules."""

from __future__ import annotations

from delayq.coordination.acl import ZkIdentity
from delayq.coordination.routing_watch import RoutingWatch
from delayq.coordination.tls import ZkTls


async def read_routing(
    hosts: str,
    namespace: str,
    topic: str,
    slots: int,
    identity: ZkIdentity | None,
    tls: ZkTls | None = None,
) -> list[int] | None:
    """The routing a service's RoutingWatch reads at start (the watch stopped at once), as a
    slot -> broker list."""
    watch = RoutingWatch(hosts, namespace, topic, slots, identity, tls)
    routing = await watch.start(lambda _routing: None)
    await watch.stop()
    return None if routing is None else list(routing.broker_of_slot)
