"""Hot paths benchmark: a user's producer and the consumer's delivery, this tree against another
revision in the same run (one throw-away redis-server, JSON on stdout).

    python bench/bench_hot_paths.py [--baseline REV] [--rounds 3] [--messages 100000]
                                    [--slots 16] [--workloads producer,delivery,python]
                                    [--output FILE]

* producer: `AsyncQueue.schedule_many` in batches of 1,000 with 2 calls in flight, the
  `ScheduleRequest`s built inside the timed loop (bench_peers.py's `delayq_batches`), 40-byte
  payloads, 12-byte ids, due within 10 s of an hour ahead (they stay pending);
* delivery: the messages due at once (bench_engine.py's `schedule_at`, 32-byte payloads), then
  a `Consumer` with the documented defaults (`ConsumerSettings()`, 16 slots) and a no-op handler
  drains them (bench_engine.py's `consume_until`): claim -> handler -> ack, messages per second
  from the first handler call to the last (`--slots 16,1024` runs both paths on a topic of each
  size);
* python: the pure-Python steps of both paths, without Redis (`run_python`).

Each figure also comes as CPU time per message, of the Python process and of redis-server (its
`INFO cpu` around the timed part), with Redis's time per message in the scripts and the commands
they call (`INFO commandstats`): on a shared machine the rates swing with the neighbours' load,
CPU per message much less. `--baseline REV` exports `operator/` of that revision (git archive)
and runs the same workloads with it, taking turns with this tree workload by workload (which
goes first alternates by round); the report has the median of the rounds, this tree's ratio to
the baseline (of the medians), and the ratio round by round (median, lowest, highest: the two
ran back to back, so a round's ratio saw one moment of the host's load). Every run carries the
1-minute load average at its end; `machine` has `uptime` at the start, `uptime_at_end` after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import redis

from bench_engine import consume_until, schedule_at
from bench_peers import TOPIC, Workload, delayq_batches
from delayq.local.redis_server import RedisServer
from delayq.queue import (
    AsyncQueue,
    ConsumerSettings,
    Mode,
    Queue,
    ScheduleRequest,
    Topic,
    plans,
)
from delayq.queue.packing import pack
from delayq.queue.plans import Plan, ScriptCall
from delayq.queue.scripts import Script

BENCH = Path(__file__).resolve().parent
REPOSITORY = BENCH.parent  # a worker imports `delayq` from its tree (PYTHONPATH)
WORKLOADS = ("producer", "delivery", "python")
# what the hot scripts call (a baseline before the functions library ran EVALSHA), each reported
# as Redis's time in it per message
REDIS_COMMANDS = (
    "fcall",
    "evalsha",
    "exists",
    "zadd",
    "zrem",
    "zmscore",
    "zrangebyscore",
    "hmget",
    "hset",
    "hdel",
)
#: what a client sends, not what the scripts call: left out of `redis_commands_per_msg`
CLIENT_COMMANDS = {"fcall", "fcall_ro", "evalsha", "info", "config|resetstat", "hello", "blpop"}
PAYLOAD = b"x" * 40
# compared round by round
RATIO_KEYS = (
    "msg_per_s",
    "python_cpu_us_per_msg",
    "redis_cpu_us_per_msg",
    "redis_transitions_us_per_msg",
)


def redis_cpu_s(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def measure(url: str, messages: int, timed: Callable[[], float]) -> dict[str, float]:
    """`timed` runs the workload and returns its rate; CPU of this process and of Redis around
    it, per message, the time Redis spent in the functions (`fcall`) and in the commands
    they call (`INFO commandstats`), and how many commands the scripts called a message (a
    script's cost grows with the slots it visits, each a few commands)."""
    client = redis.Redis.from_url(url)
    client.config_resetstat()
    redis_before, python_before = redis_cpu_s(client), time.process_time()
    rate = timed()
    python_s, redis_s = time.process_time() - python_before, redis_cpu_s(client) - redis_before
    stats = client.info("commandstats")
    client.close()
    commands = {
        f"redis_{name}_us_per_msg": round(
            stats.get(f"cmdstat_{name}", {"usec": 0})["usec"] / messages, 2
        )
        for name in REDIS_COMMANDS
    }
    script_calls = sum(
        stat["calls"]
        for name, stat in stats.items()
        if name.removeprefix("cmdstat_") not in CLIENT_COMMANDS
    )
    return {
        "msg_per_s": round(rate),
        "redis_commands_per_msg": round(script_calls / messages, 3),
        "python_cpu_us_per_msg": round(python_s / messages * 1e6, 2),
        "redis_cpu_us_per_msg": round(redis_s / messages * 1e6, 2),
        # the transitions' own time, whether they ran as functions or as scripts
        "redis_transitions_us_per_msg": round(
            commands["redis_fcall_us_per_msg"] + commands["redis_evalsha_us_per_msg"], 2
        ),
        **commands,
    }


def as_published(url: str, topic: Topic) -> None:
    """A deployed topic's brokers hold its settings record (`queue/topic_record.py`), which
    the scripts of a tree that has one read on every call: publish it, so that the figures
    include that read. A tree from before the record has nothing to publish."""
    try:
        from delayq.queue import topic_record  # absent from older trees
    except ImportError:
        return
    queue = Queue.from_url(url, topic)
    queue.publish_settings(topic_record.SERVE_OWNER, 1)
    queue.close()


def run_producer(url: str, messages: int, slots: int) -> dict[str, float]:
    as_published(url, Topic(TOPIC, slot_amount=slots))
    workload = Workload("producer", "batch", messages, lead_ms=0, window_ms=10_000)
    start_ms = int(time.time() * 1000) + 3_600_000

    def timed() -> float:
        async def produce() -> float:
            queue = AsyncQueue.from_url(url, Topic(TOPIC, slot_amount=slots))
            began = time.perf_counter()
            await delayq_batches(queue, workload, start_ms)
            elapsed = time.perf_counter() - began
            await queue.close()
            return messages / elapsed

        return asyncio.run(produce())

    return measure(url, messages, timed)


def delivered_per_s(url: str, topic: Topic, messages: int) -> float:
    """Claim → no-op → ack of `messages` due messages by a `Consumer` with the documented
    defaults: messages a second from the first handler call to the last."""
    recorder = asyncio.run(consume_until(url, topic, messages, 120, ConsumerSettings()))
    if recorder.delivered != messages:
        raise RuntimeError(f"delivered {recorder.delivered} of {messages}")
    return recorder.delivered / max(1e-9, (recorder.last_ms - recorder.first_ms) / 1000)


def run_delivery(url: str, messages: int, slots: int) -> dict[str, float]:
    topic = Topic(TOPIC, slot_amount=slots)
    as_published(url, topic)
    schedule_at(url, topic, [1_000] * messages, "msg")  # 12-byte ids, all due
    return measure(url, messages, lambda: delivered_per_s(url, topic, messages))


def run_python(url: str, messages: int, slots: int) -> dict[str, float]:
    """The pure-Python steps of both paths, µs per message (best of 3, no Redis): what the
    producer's and the consumer's CPU per message is made of, besides asyncio and redis-py.
    Batches of 1,000 requests on `slots` slots; claims of 125 messages (the default consumer's
    share of 16 slots) acked in one call each."""
    from delayq.queue import consume_plans, produce_plans  # a tree from before their split:
    # producer and delivery only (a worker imports only what its workload calls)

    topic = Topic(TOPIC, slot_amount=slots)
    batches = range(0, messages, 1_000)
    at_ms = 2_000_000_000_000

    def requests(base: int) -> list[ScheduleRequest]:
        return [
            ScheduleRequest(f"msg-{i:08d}", PAYLOAD, at_ms=at_ms) for i in range(base, base + 1_000)
        ]

    built = [requests(base) for base in batches]
    scheduled = [produce_plans.schedule(topic, batch, Mode.CREATE) for batch in built]
    schedule_replies = [[scheduled_reply(call, at_ms) for call in plan.calls] for plan in scheduled]
    claims = range(0, messages, 125)
    claim_reply: list[int | bytes] = [0, at_ms * 1000, -1, -1, 0]
    for i in range(125):
        claim_reply += [f"msg-{i:08d}".encode(), b"1:" + str(at_ms).encode() + b":7:0:" + PAYLOAD]
    claimed = consume_plans.claim(topic, 3, 1, 125, 30_000).combine([claim_reply]).messages
    acks = [consume_plans.ack(topic, claimed) for _ in claims]

    def packed(plan: Plan[Any]) -> list[bytes]:
        name = "delayq_0123456789abcdef_verb"  # as long as a real function's name
        return [pack(("FCALL", name, len(c.keys), *c.keys, *c.args)) for c in plan.calls]

    # each step drops what it built as it goes, as the clients do: results kept alive would
    # make the garbage collector scan them all again and again, a cost no client pays
    steps: dict[str, Callable[[], object]] = {
        "producer_build_requests": lambda: drain(requests(base) for base in batches),
        "producer_plan": lambda: drain(
            produce_plans.schedule(topic, b, Mode.CREATE) for b in built
        ),
        "producer_pack": lambda: drain(packed(plan) for plan in scheduled),
        "producer_reply": lambda: drain(
            plan.combine(reply) for plan, reply in zip(scheduled, schedule_replies, strict=True)
        ),
        "delivery_claim_reply": lambda: drain(
            consume_plans.claim(topic, 3, 1, 125, 30_000).combine([claim_reply]) for _ in claims
        ),
        "delivery_ack_plan": lambda: drain(consume_plans.ack(topic, claimed) for _ in claims),
        "delivery_ack_pack": lambda: drain(packed(plan) for plan in acks),
        "delivery_ack_reply": lambda: drain(plan.combine([[7] * 125]) for plan in acks),
    }
    return {name: best_us_per_msg(step, messages) for name, step in steps.items()}


def scheduled_reply(call: ScriptCall, at_ms: int) -> list[int | bytes]:
    """The reply of a schedule call whose messages were all created: its head of 6 values
    (7 with the arguments per message, which it then says), then per message 8 (schedulemany:
    and per slot its message count; a baseline before schedulemany-1 declared 10 keys a slot)."""
    from delayq.queue import produce_plans  # the python workload's, as in run_python

    slot_counts = 0
    if call.script is Script.SCHEDULE_MANY:
        keys_per_slot = 1 if Script.SCHEDULE_MANY.value.endswith("-1") else 10
        slot_counts = len(call.keys) // keys_per_slot
    head = 7 if hasattr(plans, "FIELDS_WITH_PRIORITY") else 6  # a baseline before priorities: 6
    stride = int(call.args[6]) if head == 7 else produce_plans.FIELDS_PER_REQUEST
    messages = (len(call.args) - head - slot_counts) // stride
    return [1, at_ms, b"scheduled"] * messages


def drain(results: Iterable[object]) -> None:
    deque(results, maxlen=0)


def best_us_per_msg(step: Callable[[], object], messages: int) -> float:
    best_s = min(timed_s(step) for _ in range(3))
    return round(best_s / messages * 1e6, 3)


def timed_s(step: Callable[[], object]) -> float:
    began = time.perf_counter()
    step()
    return time.perf_counter() - began


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


def run_worker(tree: Path, workload: str, url: str, messages: int, slots: int) -> dict[str, float]:
    """One workload in a fresh interpreter importing `delayq` from `tree`, with the 1-minute
    load average at its end."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "operator"), str(BENCH)])}
    command = [sys.executable, __file__, "--worker", workload, "--url", url]
    done = subprocess.run(
        [*command, "--messages", str(messages), "--slots", str(slots)],
        env=env,
        check=True,
        capture_output=True,
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result | {"loadavg_1m": round(os.getloadavg()[0], 2)}


def ratio(new: float, old: float) -> float | None:
    return round(new / old, 3) if old else None


def summary(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.median(run[key] for run in runs), 2) for key in runs[0]}


def per_round(new: list[dict[str, float]], old: list[dict[str, float]]) -> dict[str, Any]:
    """This tree's ratio to the baseline round by round (the two ran back to back): the median,
    the lowest and the highest, of the figures present in the workload."""
    figures: dict[str, Any] = {}
    for key in (k for k in RATIO_KEYS if k in new[0]):
        ratios = [r for a, b in zip(new, old, strict=True) if (r := ratio(a[key], b[key]))]
        figures[key] = {
            "median": round(statistics.median(ratios), 3),
            "min": min(ratios),
            "max": max(ratios),
            "rounds": ratios,
        }
    return figures


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a git revision measured in the same run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument(
        "--slots", default="16", help="the topics' slot amounts, comma-separated (16,1024)"
    )
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    parser.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    slot_amounts = [int(n) for n in args.slots.split(",")]
    if args.worker:
        worker = {"producer": run_producer, "delivery": run_delivery, "python": run_python}
        print(json.dumps(worker[args.worker](args.url, args.messages, slot_amounts[0])))
        return
    workloads = args.workloads.split(",")
    if unknown := set(workloads) - set(WORKLOADS):
        parser.error(f"--workloads: unknown {', '.join(sorted(unknown))}")
    # one entry per workload and topic size, "delivery@1024"
    cases = [(w, slots) for slots in slot_amounts for w in workloads]

    baseline_tree = exported(args.baseline) if args.baseline else nullcontext(None)
    with RedisServer() as server, baseline_tree as baseline:
        trees = {"this tree": REPOSITORY} | ({"baseline": baseline} if baseline else {})
        client = redis.Redis.from_url(server.url)
        redis_server = client.info("server")
        runs: dict[str, dict[str, list[dict[str, float]]]] = {
            name: {f"{w}@{slots}": [] for w, slots in cases} for name in trees
        }
        machine_at_start = machine()
        for round_number in range(args.rounds):
            order = list(trees.items())
            for workload, slots in cases:
                for name, tree in order if round_number % 2 == 0 else order[::-1]:
                    client.flushall()
                    runs[name][f"{workload}@{slots}"].append(
                        run_worker(tree, workload, server.url, args.messages, slots)
                    )
        client.close()
    results: dict[str, Any] = {
        "machine": machine_at_start,
        "uptime_at_end": machine()["uptime"],
        "redis_server": {k: redis_server[k] for k in ("redis_version", "redis_build_id")},
        "messages": args.messages,
        "rounds": args.rounds,
        "baseline": args.baseline,
        "median": {name: {c: summary(r) for c, r in per.items()} for name, per in runs.items()},
        "runs": runs,
    }
    if args.baseline:
        new, old = results["median"]["this tree"], results["median"]["baseline"]
        results["ratio_to_baseline"] = {
            c: {key: ratio(new[c][key], old[c][key]) for key in new[c] if key != "loadavg_1m"}
            for c in new
        }
        results["ratio_per_round"] = {
            c: per_round(runs["this tree"][c], runs["baseline"][c]) for c in new
        }
    text = json.dumps(results, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
