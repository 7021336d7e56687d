"""`delayq routing show|move-slot|split`: a topic's slot -> broker routing, moving one slot live
and doubling the slot amount live.

These talk to the topic's brokers and ZooKeeper directly, not to the HTTP API, with the same
settings as `delayq serve` (topic file, DELAYQ_* variables, flags): run them in any delay-service
pod of the topic (`kubectl exec <pod> -- delayq routing show`), where those are set. A move that
stopped half way (the command was killed, a broker went away) is finished by running the same
command again, or rolled back with `--abort` before its routing switched (docs/coordination.md,
"Moving a slot", "Doubling the slots"). Once the slots doubled, the routing node's slot amount
and key generation are used, not the settings' slotAmount.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from delayq.service.admin_cli import non_negative
from delayq.service.config import ConfigError, ServiceConfig, add_arguments

OK, BAD_INPUT, UNREACHABLE = 0, 2, 3
REDIS_TIMEOUT_S = 30.0


def register(subparsers: Any) -> None:
    """Add `routing show`, `routing move-slot` and `routing split` to the `delayq` command."""
    group = subparsers.add_parser(
        "routing",
        help="a topic's slot -> broker routing: show it, move a slot, double the slots",
        description="Settings as for `delayq serve`: DELAYQ_* variables, --config, flags.",
    )
    commands = group.add_subparsers(dest="routing_command", required=True)
    show = commands.add_parser(
        "show", help="slots per broker, the moves and the doubling under way"
    )
    show.add_argument("--json", action="store_true", help="the routing, moves and doubling as JSON")
    add_arguments(show)
    show.set_defaults(handler=_handler(_show))
    move = commands.add_parser(
        "move-slot",
        help="move one slot's messages to another broker, live (resumes a stopped move)",
    )
    move.add_argument("--slot", type=non_negative, required=True, help="the slot to move")
    move.add_argument(
        "--to-broker", type=non_negative, required=True, help="the broker index to move it to"
    )
    move.add_argument(
        "--abort", action="store_true", help="roll back the slot's move (before its switch)"
    )
    add_arguments(move)
    move.set_defaults(handler=_handler(_move))
    split = commands.add_parser(
        "split",
        help="double the slot amount, live: slot s splits into s and s+N on its broker "
        "(resumes a stopped doubling)",
    )
    split.add_argument(
        "--to-slots",
        type=non_negative,
        required=True,
        help="the slot amount to reach (a power of two; doubles as often as needed)",
    )
    split.add_argument(
        "--abort", action="store_true", help="roll back the doubling (before its switch)"
    )
    add_arguments(split)
    split.set_defaults(handler=_handler(_split))


def _handler(run: Any) -> Any:
    """The command with every failure as one line on stderr and an exit code."""

    def handle(args: argparse.Namespace) -> int:
        from kazoo.exceptions import KazooException
        from kazoo.handlers.threading import KazooTimeoutError
        from redis import RedisError

        from delayq.coordination.migration import MoveError
        from delayq.service.cli import settings

        name = f"delayq routing {args.routing_command}"
        try:
            config = settings(args)
            if not config.zookeeper_connect:
                raise ConfigError("needs ZooKeeper: --zookeeper-connect (DELAYQ_ZOOKEEPER_CONNECT)")
            with connected(config) as (zk, paths, queues):
                return int(run(zk, paths, queues, args))
        except (ConfigError, MoveError, ValueError) as error:
            print(f"{name}: {error}", file=sys.stderr)
            return BAD_INPUT
        except (RedisError, KazooException, KazooTimeoutError, OSError) as error:
            # KazooTimeoutError (ZooKeeper not answering at start) is no KazooException
            print(f"{name}: {type(error).__name__}: {error}", file=sys.stderr)
            return UNREACHABLE

    return handle


@contextmanager
def connected(config: ServiceConfig) -> Iterator[tuple[Any, Any, list[Any]]]:
    """ZooKeeper, the topic's paths and a client per broker under the routing's slot amount
    and generation (the settings' when there is no routing node yet)."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError

    from delayq.coordination.acl import tree_acl
    from delayq.coordination.layout import TopicPaths
    from delayq.coordination.routing import Routing
    from delayq.coordination.splitting import routed_topic
    from delayq.coordination.tls import kazoo_options
    from delayq.queue.client import Queue

    identity = config.zookeeper_identity
    acl = (
        tree_acl(identity.acl_id, config.zookeeper_admin_acl)
        if identity and config.zookeeper_admin_acl
        else None
    )
    zk = KazooClient(
        hosts=config.zookeeper_connect,
        timeout=config.zookeeper_session_timeout_ms / 1000,
        auth_data=[identity.auth_data] if identity else None,
        default_acl=acl,
        **kazoo_options(config.zookeeper_client_tls),
    )
    paths = TopicPaths(config.namespace, config.topic)
    topic = config.to_topic()
    queues: list[Queue] = []
    zk.start(timeout=config.zookeeper_session_timeout_ms / 1000)
    try:
        with suppress(NoNodeError):  # no node yet: the settings' slot amount
            topic = routed_topic(topic, Routing.from_json(zk.get(paths.routing)[0]))
        queues += [
            Queue.from_url(url, topic, socket_timeout=REDIS_TIMEOUT_S)
            for url in config.broker_redis_urls
        ]
        yield zk, paths, queues
    finally:
        zk.stop()
        zk.close()
        for queue in queues:
            queue.close()


def _show(zk: Any, paths: Any, queues: list[Any], args: argparse.Namespace) -> int:
    from delayq.coordination.migration import SlotMover
    from delayq.coordination.splitting import SlotSplitter

    mover = SlotMover(zk, paths, queues)
    routing, version = mover.routing()
    migrations = mover.migrations()
    split = SlotSplitter(zk, paths, queues).state()
    if args.json:
        document = {
            "routing": json.loads(routing.to_json()),
            "routingVersion": version,
            "migrations": [json.loads(m.encode()) for m in migrations],
            "split": None if split is None else json.loads(split.encode()),
        }
        print(json.dumps(document, indent=2))
        return OK
    origin = f"node version {version}" if version is not None else "first routing, no node yet"
    print(
        f"{routing.slot_amount} slots (generation {routing.generation}) over "
        f"{routing.broker_count} brokers ({origin})"
    )
    for broker, count in routing.slots_per_broker().items():
        print(f"broker {broker}: {count} slots {_ranges(routing.slots_of(broker))}")
    for m in migrations:
        print(f"moving slot {m.slot}: broker {m.source} -> {m.target}, next step {m.step}")
    if split is not None:
        print(
            f"doubling {split.from_amount} -> {split.to_amount} slots (generation "
            f"{split.to_generation}): next step {split.step}, {split.copied_slots} of "
            f"{split.from_amount} slots copied"
        )
    return OK


def _move(zk: Any, paths: Any, queues: list[Any], args: argparse.Namespace) -> int:
    from delayq.coordination.migration import SlotMover

    mover = SlotMover(zk, paths, queues)
    if args.abort:
        m = mover.abort(args.slot)
        print(f"slot {m.slot}: move to broker {m.target} rolled back, on broker {m.source}")
        return OK
    m = mover.move(args.slot, args.to_broker)
    print(f"slot {m.slot}: moved from broker {m.source} to broker {m.target}")
    return OK


def _split(zk: Any, paths: Any, queues: list[Any], args: argparse.Namespace) -> int:
    from delayq.coordination.splitting import SlotSplitter

    splitter = SlotSplitter(zk, paths, queues)
    if args.abort:
        split = splitter.abort()
        print(f"doubling to {split.to_amount} slots rolled back: {split.from_amount} slots")
        return OK
    done = splitter.split(args.to_slots)
    if done is None:
        print(f"the topic has {args.to_slots} slots already")
    else:
        print(f"doubled to {done.to_amount} slots (generation {done.to_generation})")
    return OK


def _ranges(slots: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5": a broker's slots as a human reads them."""
    parts: list[str] = []
    for slot in slots:
        if parts and slot == int(parts[-1].rsplit("-", 1)[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{slot}"
        else:
            parts.append(str(slot))
    return ",".join(parts) or "-"
