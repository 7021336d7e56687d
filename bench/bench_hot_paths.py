"""Hot paths benchmark: a user's producer and the consumer's delivery, this tree against another
revision in the same run (one throw-away redis-server, JSON on stdout).

    python bench/bench_hot_paths.py [--baseline REV] [--rounds 3] [--messages 100000]
                                    [--output FILE]

* producer: `AsyncQueue.schedule_many` in batches of 1,000 with 2 calls in flight, the
  `ScheduleRequest`s built inside the timed loop (bench_peers.py's `delayq_batches`), 40-byte
  payloads, 12-byte ids, due within 10 s of an hour ahead (they stay pending);
* delivery: the messages due at once, then a `Consumer` with the documented defaults
  (`ConsumerSettings()`, 16 slots) and a no-op handler drains them (bench_engine.py's
  `consume_until`): claim -> handler -> ack, messages per second from the first handler call
  to the last.

Each figure also comes as CPU time per message, of the Python process and of redis-server (its
`INFO cpu` around the timed part): on a shared machine the rates swing with the neighbours' load,
CPU per message much less. `--baseline REV` exports `operator/` of that revision (git archive)
and runs the same workloads with it, alternating with this tree round by round; the report has
the median of the rounds and this tree's ratio to the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import redis

from bench_engine import consume_until, fresh_topic, schedule_at
from bench_peers import TOPIC, Workload, delayq_batches
from delayq.local.redis_server import RedisServer
from delayq.queue import AsyncQueue, ConsumerSettings

BENCH = Path(__file__).resolve().parent
REPOSITORY = BENCH.parent  # a worker imports `delayq` from its tree (PYTHONPATH)
WORKLOADS = ("producer", "delivery")


def redis_cpu_s(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def measure(url: str, messages: int, timed: Callable[[], float]) -> dict[str, float]:
    """`timed` runs the workload and returns its rate; CPU of this process and of Redis around
    it, per message."""
    client = redis.Redis.from_url(url)
    redis_before, python_before = redis_cpu_s(client), time.process_time()
    rate = timed()
    python_s, redis_s = time.process_time() - python_before, redis_cpu_s(client) - redis_before
    client.close()
    return {
        "msg_per_s": round(rate),
        "python_cpu_us_per_msg": round(python_s / messages * 1e6, 2),
        "redis_cpu_us_per_msg": round(redis_s / messages * 1e6, 2),
    }


def run_producer(url: str, messages: int) -> dict[str, float]:
    workload = Workload("producer", "batch", messages, lead_ms=0, window_ms=10_000)
    start_ms = int(time.time() * 1000) + 3_600_000

    def timed() -> float:
        async def produce() -> float:
            queue = AsyncQueue.from_url(url, fresh_topic(TOPIC))
            began = time.perf_counter()
            await delayq_batches(queue, workload, start_ms)
            elapsed = time.perf_counter() - began
            await queue.close()
            return messages / elapsed

        return asyncio.run(produce())

    return measure(url, messages, timed)


def run_delivery(url: str, messages: int) -> dict[str, float]:
    topic = fresh_topic(TOPIC)
    schedule_at(url, topic, [1_000] * messages, "msg")  # 12-byte ids, all due

    def timed() -> float:
        recorder = asyncio.run(consume_until(url, topic, messages, 120, ConsumerSettings()))
        if recorder.delivered != messages:
            raise RuntimeError(f"delivered {recorder.delivered} of {messages}")
        return recorder.delivered / max(1e-9, (recorder.last_ms - recorder.first_ms) / 1000)

    return measure(url, messages, timed)


@contextmanager
def exported(revision: str) -> Iterator[Path]:
    """`operator/` of `revision`, in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="delayq-baseline-") as directory:
        archive = subprocess.run(
            ["git", "-C", str(REPOSITORY), "archive", revision, "operator"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", directory], input=archive, check=True)
        yield Path(directory)


def run_worker(tree: Path, workload: str, url: str, messages: int) -> dict[str, float]:
    """One workload in a fresh interpreter importing `delayq` from `tree`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "operator"), str(BENCH)])}
    command = [sys.executable, __file__, "--worker", workload, "--url", url]
    done = subprocess.run(
        [*command, "--messages", str(messages)], env=env, check=True, capture_output=True
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(run[key] for run in runs), 2) for key in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a git revision measured in the same run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    parser.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker = run_producer if args.worker == "producer" else run_delivery
        print(json.dumps(worker(args.url, args.messages)))
        return

    baseline_tree = exported(args.baseline) if args.baseline else nullcontext(None)
    with RedisServer() as server, baseline_tree as baseline:
        trees = {"this tree": REPOSITORY} | ({"baseline": baseline} if baseline else {})
        client = redis.Redis.from_url(server.url)
        runs: dict[str, dict[str, list[dict[str, float]]]] = {
            name: {w: [] for w in WORKLOADS} for name in trees
        }
        load_start = os.getloadavg()[0]
        for round_number in range(args.rounds):
            order = list(trees.items())
            for name, tree in order if round_number % 2 == 0 else order[::-1]:
                for workload in WORKLOADS:
                    client.flushall()
                    runs[name][workload].append(
                        run_worker(tree, workload, server.url, args.messages)
                    )
        client.close()
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_1m_at_start": load_start,
            "loadavg_1m_at_end": os.getloadavg()[0],
        },
        "messages": args.messages,
        "rounds": args.rounds,
        "baseline": args.baseline,
        "median": {name: {w: summary(r) for w, r in per.items()} for name, per in runs.items()},
        "runs": runs,
    }
    if args.baseline:
        new, old = results["median"]["this tree"], results["median"]["baseline"]
        results["ratio_to_baseline"] = {
            w: {key: round(new[w][key] / old[w][key], 2) for key in new[w]} for w in WORKLOADS
        }
    text = json.dumps(results, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
