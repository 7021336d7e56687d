"""FCALL of the engine's functions library vs the EVALSHA path it replaced: one command, a
throw-away redis-server, JSON on stdout.

    python bench/bench_functions.py [--quick] [--output FILE]

The hot paths (`schedule_many` in chunks of 1,000, and claim -> ack of batches of 100) run
through the real `Queue`, once with its FCALLs and once with the scripts' standalone sources
(`scripts.script_source`, the same transitions) sent as EVALSHA as the client did before
(one Script object per call, bare EVALSHA pipelines). Rounds alternate between the two on the
same server in the same run, so the ratio (fcall / evalsha throughput) holds on a noisy host;
the median round counts.
"""

from __future__ import annotations

import argparse
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


def schedule_round(queue: Queue, count: int) -> float:
    """Messages per second through schedule_many (chunks of CHUNK, every slot per chunk)."""
    start = time.perf_counter()
    for first in range(0, count, CHUNK):
        queue.schedule_many(
            [ScheduleRequest(f"m{i}", b"x" * 32, delay_ms=0) for i in range(first, first + CHUNK)]
        )
    return count / (time.perf_counter() - start)


def claim_ack_round(queue: Queue, count: int) -> float:
    """Messages per second claimed and acked, batches of CLAIM_BATCH per slot (the messages
    are scheduled first, untimed)."""
    schedule_round(queue, count)
    epochs = {slot: queue.take_over(slot) for slot in range(SLOTS)}
    done = 0
    start = time.perf_counter()
    while done < count:
        for slot, epoch in epochs.items():
            batch = queue.claim(slot, epoch, CLAIM_BATCH, 60_000)
            if batch.messages:
                queue.ack_many([m.lease for m in batch.messages])
                done += len(batch.messages)
    return count / (time.perf_counter() - start)


def alternate(
    client: redis.Redis, rounds: int, measure: Callable[[Queue], float]
) -> dict[str, Any]:
    figures: dict[str, list[float]] = {"fcall": [], "evalsha": []}
    for make in (Queue, EvalshaQueue):  # untimed: loads the library, warms both paths
        make(client, Topic("warm", slot_amount=SLOTS)).schedule_many(
            [ScheduleRequest(f"w{i}", b"", delay_ms=0) for i in range(CHUNK)]
        )
    for index in range(rounds):
        for name, make in (("fcall", Queue), ("evalsha", EvalshaQueue)):
            client.flushall()
            figures[name].append(measure(make(client, Topic(f"{name}{index}", slot_amount=SLOTS))))
    fcall, evalsha = statistics.median(figures["fcall"]), statistics.median(figures["evalsha"])
    return {
        "fcall_msg_per_s": round(fcall),
        "evalsha_msg_per_s": round(evalsha),
        "ratio_fcall_to_evalsha": round(fcall / evalsha, 3),
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    count, rounds = (10_000, 3) if args.quick else (50_000, 7)
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
            "schedule_many": alternate(client, rounds, lambda q: schedule_round(q, count)),
            "claim_ack": alternate(client, rounds, lambda q: claim_ack_round(q, count)),
        }
        results["machine"]["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        client.close()
    text = json.dumps(results, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
