"""Deleting the engine's old Redis Functions libraries from a topic's masters (issue 34).

Each version of the engine is one library, `delayq_<hash>` (queue/functions.py, ~75 KB), which
the operator loads on every master (handlers/health.py); without deletion every upgrade left
one more behind for good. The restricted users cannot load a library, so deleting one that a
running client still calls stops that client (FunctionsMissingError, a 503 with Retry-After,
not-ready) until its pod is replaced: the operator loads its own version's library only, it
has no other's source. So a library is deleted only when all of this holds:

- it is not this operator's (`functions.library()`);
- no live member names it: each delay service writes the library it calls into its ephemeral
  member node (coordination/layout.encode_member), so an old pod of a rolling upgrade keeps
  its library until it is gone. A member naming none (a version before the field) makes every
  library of the topic unknown: nothing is deleted until those pods have rolled;
- ZooKeeper answered this pass (unknown members: nothing deleted);
- the first two have held for LIBRARY_GRACE_S on this leader's clock, counted from the first
  pass that saw them (kept per term, so a new leader starts counting again: a deletion is only
  ever late).

The grace covers clients that are not members: a member between ZooKeeper sessions (its node
is gone until it registers again), and producers and pipelines that log in to the brokers
directly (`delayq pipeline ingest`, a `RoutedQueue`), which register nowhere. Those keep their
library for LIBRARY_GRACE_S after the last pod of their version left; run them at the
operator's version after an upgrade (docs/operator.md, "Changes, pause, deletion").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import redis

from delayq.kube.builders.service import zookeeper_connect
from delayq.kube.context import Logger, OperatorContext
from delayq.kube.errors import TRANSIENT_ERRORS
from delayq.kube.spec import TopicSpec
from delayq.kube.zk import MembersUnreadable
from delayq.queue import functions

#: How long a library must have been unused (not the operator's, named by no live member)
#: before it is deleted: well beyond a member's ZooKeeper session loss (seconds) and the
#: length of a pipeline run that began before its version's pods rolled.
LIBRARY_GRACE_S = 3600.0


def unused_libraries(loaded: Iterable[str], current: str, named: Collection[str]) -> set[str]:
    """The libraries of `loaded` that neither this operator (`current`) nor a live member
    (`named`, one entry per member) calls; none when a member names no library ("")."""
    if "" in named:
        return set()
    return set(loaded) - {current} - set(named)


async def libraries_in_use(
    ctx: OperatorContext, spec: TopicSpec, logger: Logger
) -> list[str] | None:
    """The library each live member of the topic names; None when ZooKeeper did not answer
    or the topic's members are too many to read (then no library is deleted this pass)."""
    connect = zookeeper_connect(spec, ctx.build)
    try:
        return await ctx.store.member_libraries(connect, spec.namespace, spec.name)
    except (*TRANSIENT_ERRORS, MembersUnreadable) as error:
        logger.warning("members' functions libraries unknown this pass: %s", error)
        return None


async def delete_unused_libraries(
    ctx: OperatorContext,
    spec: TopicSpec,
    broker: int,
    master_address: str,
    password: str,
    named: Collection[str],
    logger: Logger,
) -> None:
    """Delete the libraries of one master that have been unused for LIBRARY_GRACE_S, start
    the grace of those newly unused, and warn about a library a live member calls that the
    master lacks (it cannot be loaded here: its pods fail until they are replaced). Failures
    are logged: the next pass tries again."""
    current = functions.library().name
    try:
        loaded = await ctx.redis.libraries(master_address, password)
        for name in sorted(set(named) - set(loaded) - {current, ""}):
            logger.warning(
                "broker %d lacks functions library %s that a live member calls: those members "
                "fail until they run this operator's version",
                broker,
                name,
            )
        unused = unused_libraries(loaded, current, named)
        since = ctx.library_unused_since
        prefix = (spec.namespace, spec.name, broker)
        for key in [key for key in since if key[:3] == prefix and key[3] not in unused]:
            del since[key]  # in use again, or gone
        now = ctx.clock()
        for name in sorted(unused):
            if now - since.setdefault((*prefix, name), now) >= LIBRARY_GRACE_S:
                await ctx.redis.delete_library(master_address, password, name)
                del since[(*prefix, name)]
                logger.info("deleted unused functions library %s on broker %d", name, broker)
    except (redis.RedisError, *TRANSIENT_ERRORS) as error:
        logger.warning("old functions libraries of broker %d not checked: %r", broker, error)
