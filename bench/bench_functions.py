"""FCALL of the engine's functions library vs the EVALSHA path it replaced: one command, a
throw-away redis-server, JSON on stdout.

    python bench/bench_functions.py [--quick] [--output FILE]

The hot paths (`schedule_many` in chunks of 1,000, and claim -> ack of batches of 100) run
through the real `Queue`, once with its FCALLs and once with the scripts' standalone sources
(`scripts.script_source`, the same transitions) sent as EVALSHA as the client did before
(one Script object per call, bare EVALSHA pipelines), each on its own topic of the same server.
Within a round the two take turns call by call (a chunk, or a slot's claim + ack), which one
goes first alternating, so both see the same moments of a noisy host; the ratio (fcall /
evalsha throughput) is taken per round and its median reported. Redis's own time per message
in the calls (INFO commandstats) is reported beside it: the part the change could alter
(claim_ack's covers the untimed scheduling too).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from delayq.local.redis_server import RedisServer
from delayq.queue import Queue, ScheduleRequest, Topic
from delayq.queue.client import _raise_first_error, _typed
from delayq.queue.plans import Plan, ScriptCall
from delayq.queue.scripts import Script, script_source

SLOTS = 16
CHUNK = 1_000
CLAIM_BATCH = 100


class EvalshaQueue(Queue):
    """The engine client as it was: each transition an EVALSHA of its standalone script."""

    def __init__(self, client: redis.Redis, topic: Topic) -> None:
        super().__init__(client, topic)
        self._scripts = {s: client.register_script(script_source(s)) for s in Script}
        for script in Script:  # as the old client after its first NOSCRIPT
            client.script_load(script_source(script))

    def _pipelined(self, calls: Sequence[ScriptCall], wait: int) -> tuple[list[Any], int | None]:
        pipe = self.redis.pipeline(transaction=False)
        for call in calls:
            pipe.evalsha(self._scripts[call.script].sha, len(call.keys), *call.keys, *call.args)
        return pipe.execute(raise_on_error=False), None

    def _replies(self, plan: Plan[Any]) -> tuple[list[Any], int | None]:
        if len(plan.calls) == 1:
            call = plan.calls[0]
            return [self._scripts[call.script](keys=call.keys, args=call.args)], None
        replies, _ = self._pipelined(plan.calls, 0)
        return (_typed(replies) if plan.partial else _raise_first_error(replies)), None


Pair = dict[str, Queue]  # "fcall" / "evalsha" -> its client, each on its own topic


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def _requests(first: int) -> list[ScheduleRequest]:
    return [ScheduleRequest(f"m{i}", b"x" * 32, delay_ms=0) for i in range(first, first + CHUNK)]


def _interleaved(steps: list[dict[str, Callable[[], object]]]) -> dict[str, float]:
    """Seconds each path spent, its steps run in turns with the other's (which goes first
    alternates), so both see the same moments of a noisy host."""
    spent = {"fcall": 0.0, "evalsha": 0.0}
    for index, step in enumerate(steps):
        for name in ("fcall", "evalsha") if index % 2 == 0 else ("evalsha", "fcall"):
            spent[name] += _timed(step[name])
    return spent


def schedule_round(pair: Pair, count: int) -> dict[str, float]:
    """Seconds per path to schedule `count` messages through schedule_many, chunk by chunk."""
    steps: list[dict[str, Callable[[], object]]] = [
        {
            name: functools.partial(queue.schedule_many, _requests(first))
            for name, queue in pair.items()
        }
        for first in range(0, count, CHUNK)
    ]
    return _interleaved(steps)


def _claim_and_ack(queue: Queue, slot: int, epoch: int) -> int:
    batch = queue.claim(slot, epoch, CLAIM_BATCH, 60_000)
    queue.ack_many([m.lease for m in batch.messages])
    return len(batch.messages)


def claim_ack_round(pair: Pair, count: int) -> dict[str, float]:
    """Seconds per path to claim and ack `count` messages, batches of CLAIM_BATCH, slot after
    slot until each is empty (scheduled first, untimed)."""
    for first in range(0, count, CHUNK):
        for queue in pair.values():
            queue.schedule_many(_requests(first))
    epochs = {name: {s: q.take_over(s) for s in range(SLOTS)} for name, q in pair.items()}
    steps: list[dict[str, Callable[[], object]]] = [
        {
            name: functools.partial(_claim_and_ack, queue, slot, epochs[name][slot])
            for name, queue in pair.items()
        }
        for slot in range(SLOTS)
        for _ in range(-(-count // CLAIM_BATCH) // SLOTS * 2)  # enough for an uneven spread
    ]
    spent = _interleaved(steps)
    for name, queue in pair.items():
        if queue.stats().prepared or queue.stats().due:
            raise AssertionError(f"{name}: messages left unclaimed, add steps")
    return spent


def redis_usec(client: redis.Redis, command: str) -> float:
    """Redis's own time in `command` since the last CONFIG RESETSTAT, in µs (the scripts'
    and functions' run time, without the client's and the network's)."""
    return float(client.info("commandstats").get(f"cmdstat_{command}", {}).get("usec", 0))


def rounds_of(
    client: redis.Redis, rounds: int, count: int, measure: Callable[[Pair, int], dict[str, float]]
) -> dict[str, Any]:
    """Median over rounds of each path's rate, of the per-round ratio, and of Redis's time in
    each path's calls."""
    for make in (Queue, EvalshaQueue):  # untimed: loads the library, warms both paths
        make(client, Topic("warm", slot_amount=SLOTS)).schedule_many(_requests(0))
    figures: dict[str, list[float]] = {
        key: [] for key in ("fcall", "evalsha", "ratio", "us_f", "us_e")
    }
    for index in range(rounds):
        client.flushall()
        pair: Pair = {
            "fcall": Queue(client, Topic(f"f{index}", slot_amount=SLOTS)),
            "evalsha": EvalshaQueue(client, Topic(f"e{index}", slot_amount=SLOTS)),
        }
        client.config_resetstat()
        spent = measure(pair, count)
        figures["fcall"].append(count / spent["fcall"])
        figures["evalsha"].append(count / spent["evalsha"])
        figures["ratio"].append(spent["evalsha"] / spent["fcall"])
        figures["us_f"].append(redis_usec(client, "fcall"))
        figures["us_e"].append(redis_usec(client, "evalsha"))
    median = {key: statistics.median(values) for key, values in figures.items()}
    return {
        "fcall_msg_per_s": round(median["fcall"]),
        "evalsha_msg_per_s": round(median["evalsha"]),
        "ratio_fcall_to_evalsha": round(median["ratio"], 3),
        "ratio_per_round": [round(r, 3) for r in figures["ratio"]],
        "redis_usec_per_msg_fcall": round(median["us_f"] / count, 2),
        "redis_usec_per_msg_evalsha": round(median["us_e"] / count, 2),
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    count, rounds = (10_000, 4) if args.quick else (50_000, 8)
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        load_before = os.getloadavg()[0]
        results = {
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "loadavg_1m_at_start": round(load_before, 2),
            },
            "redis_version": client.info("server")["redis_version"],
            "messages_per_round": count,
            "schedule_many": rounds_of(client, rounds, count, schedule_round),
            "claim_ack": rounds_of(client, rounds, count, claim_ack_round),
        }
        results["machine"]["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        client.close()
    text = json.dumps(results, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
