"""The operator publishes each DelayTopic's settings record on its brokers (the health pass).

The record (`queue/topic_record.py`) is what every client's scripts obey: the topic's quota,
retries, expiry and retention, whatever `Topic` the client built. The operator owns it: it
writes as its admin user, which the topic's users are not (they may only read it). Owner: the
DelayTopic's uid, so a topic deleted and made again under its name replaces the old record;
version: its `metadata.generation`, which every spec change raises, so an operator holding an
older spec (a leader that has not seen the change yet) never replaces a newer record.

Published on every pass, not only on a change: a new broker and a master restarted without its
data get it within a pass, and a changed spec reaches every client within a pass, without a
restart. While a doubling is due (`spec.slotAmount` above the routing's), the keys of the next
generation get theirs too, ahead: the doubling's switch finds them in place, so no client of
the doubled slots runs with its own values until the next pass. An unchanged record is only read
(`topic_record.publish`), so a pass costs one pipelined round trip of reads per broker (5 µs of
Redis a slot) and is not held up by a master whose writes are paused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import redis

from delayq.coordination.routing import Routing
from delayq.coordination.splitting import routed_topic
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.errors import TRANSIENT_ERRORS
from delayq.kube.spec import TopicSpec
from delayq.queue.topic import Topic


async def publish_settings(
    ctx: OperatorContext,
    owner: Mapping[str, Any],
    spec: TopicSpec,
    routing: Routing,
    broker: int,
    master_address: str,
    password: str,
    logger: Logger,
) -> None:
    """Publish `spec`'s settings on one broker's master, for every slot of the routing (a slot
    move then finds the record on its target) and of a due doubling. A failure is logged and
    tried again next pass; meanwhile the scripts keep the record they have, or the callers'
    own values where there is none."""
    metadata = owner.get("metadata") or {}
    uid, generation = str(metadata.get("uid") or ""), int(metadata.get("generation") or 0)
    versions: list[int] = []
    try:
        for topic in published_topics(spec, routing):
            versions += await ctx.redis.publish_settings(
                master_address, password, topic, uid, generation
            )
    except (redis.RedisError, *TRANSIENT_ERRORS) as error:
        logger.warning("settings of broker %d not published: %r", broker, error)
        return
    newest = max(versions, default=generation)
    if newest > generation:
        logger.warning(
            "broker %d holds the settings of generation %d, newer than this spec's %d: kept",
            broker,
            newest,
            generation,
        )


def published_topics(spec: TopicSpec, routing: Routing) -> list[Topic]:
    """The key generations whose slots get the record: the routing's, and the next one while
    a doubling is due (twice the slots, each with half the share of the quota)."""
    served = routed_topic(spec.topic, routing)
    if spec.slot_amount <= routing.slot_amount:
        return [served]
    doubled = replace(
        served, slot_amount=2 * routing.slot_amount, slot_generation=routing.generation + 1
    )
    return [served, doubled]
