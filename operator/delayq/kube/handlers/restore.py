"""Reading a topic's routing, and publishing it again from its status copy when ZooKeeper lost it.

Both writers of the status copy read the routing here: reconcile, before it publishes, and the
leader's health pass, every interval (so a lost node comes back within one health interval, not
at the next change of the spec or restart of the operator). A missing node with a copy in
`status.routing` (kube/routing_record.py) is published again from the copy, never as the first
routing: with slots moved or doubled, the first routing would send every client and pod to
brokers and keys that do not hold the messages. docs/operator.md, "When ZooKeeper loses its
data", says what the copy cannot bring back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from delayq.coordination.routing import Routing
from delayq.kube.builders.service import zookeeper_connect
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.events import WARNING, TopicEvent
from delayq.kube.routing_record import recorded_routing
from delayq.kube.spec import TopicSpec

RESTORED_REASON = "RoutingRestored"


async def read_or_restore(
    ctx: OperatorContext,
    body: Mapping[str, Any],
    spec: TopicSpec,
    topic_password: str,
    logger: Logger,
) -> Routing | None:
    """The routing in ZooKeeper; when it has none, the status copy published again (a Warning
    Event and a log line say so); None when neither exists (a new topic). Raises
    RoutingRecordInvalid when only an unreadable copy is left, and what the store raises."""
    connect = zookeeper_connect(spec, ctx.build)
    current = await ctx.store.read_routing(connect, spec.namespace, spec.name)
    if current is not None:
        return current
    recorded = recorded_routing(body.get("status") or {})
    if recorded is None:
        return None
    uid = str((body.get("metadata") or {}).get("uid") or "")
    await ctx.store.publish(
        connect, spec.namespace, spec.name, recorded, topic_password, uid=uid
    )
    counts = ", ".join(f"{b}: {n}" for b, n in recorded.slots_per_broker().items())
    message = (
        f"ZooKeeper {connect} had no routing for the topic (its data was lost, or it is "
        f"another ensemble): published again the copy in status.routing, {recorded.slot_amount} "
        f"slots at key generation {recorded.generation}, slots per broker {counts}."
    )
    logger.warning("%s", message)
    await ctx.recorder.post(ctx.kube, body, [TopicEvent(WARNING, RESTORED_REASON, message)])
    return recorded
