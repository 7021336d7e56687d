"""How long a delay service may take to stop (pure): what a slot handoff and SIGTERM wait for.

The service (`DelayService.stop`) releases its slots, waiting up to `release_drain_s` for the
deliveries in flight to be acked (the next owner's fence refuses a later ack, and the message
is delivered twice), then waits up to its grace period for the delivery loops, then up to
`OWNERSHIP_STOP_TIMEOUT_S` for ZooKeeper. The operator gives the pod a termination grace period
covering all of it (`termination_grace_s`): the kubelet's SIGKILL at its end would cut a handoff
short, and every message whose POST was in flight would be delivered again (at least once
still, but not the graceful handoff docs/reliability.md promises).
"""

from __future__ import annotations

import math

from delayq.queue.consumer import ConsumerSettings
from delayq.queue.topic import TopicType

GRACE_MS = 20_000  # SIGTERM: the default wait for the delivery loops (`grace_ms`)
ACK_AFTER_POST_S = 2.0  # a handoff's wait for the ack of a POST answered at its timeout
OWNERSHIP_STOP_TIMEOUT_S = 10.0  # ephemeral owner nodes vanish with the session anyway
KILL_MARGIN_S = 5.0  # the process's own start of shutdown and exit, after the waits above


def release_drain_s(topic_type: TopicType, webhook_timeout_ms: int) -> float:
    """How long a handoff waits for its slots' deliveries in flight to be acked. A webhook POST
    ends within the webhook timeout (which may be well over the engine's default, up to 5
    minutes), and its ack follows it."""
    default = ConsumerSettings.release_drain_s
    if topic_type is not TopicType.WEBHOOK:
        return default
    return max(default, webhook_timeout_ms / 1000 + ACK_AFTER_POST_S)


def termination_grace_s(topic_type: TopicType, webhook_timeout_ms: int, grace_ms: int) -> int:
    """The pod's `terminationGracePeriodSeconds`: every wait of a stop, one after the other,
    and a margin (45 s with the defaults, 47 s for a webhook topic's 10 s timeout)."""
    waits_s = release_drain_s(topic_type, webhook_timeout_ms) + grace_ms / 1000
    return math.ceil(waits_s + OWNERSHIP_STOP_TIMEOUT_S + KILL_MARGIN_S)
