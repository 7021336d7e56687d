"""Broker memory per pending message: a throw-away redis-server, JSON on stdout.

    python bench/bench_memory.py [--count 100000] [--slots 16 [1024 ...]] [--record-buckets]
        [--store-buckets]

For each payload size (32, 40, 256, 1024 bytes) and id length (12 and 36 bytes: a short key and
a UUID), schedules `count` messages (no headers, due times spread over a day, so they stay
pending) into an empty topic with `Queue.schedule_many`, and reads `used_memory` from INFO
memory before (after a warm-up message) and after: the difference over `count` is what one
pending message costs,
everything included (the message hash, its due-index entry, its share of the slot's keys).
`messages_per_gib` is 1 GiB over that, and `messages_per_broker_at_<limit>` what a broker
pod whose container has that memory limit holds before it refuses writes: its `maxmemory`
(80% of the limit, `delayq.kube.builders.redis.redis_maxmemory`) minus the empty server's use.
The docs' sizing table (docs/operator.md, "Sizing broker memory") comes from this script.

`outcomes`: what one remembered finished id costs on a topic with `outcome_retention_ms` (per
id length): `count` messages are scheduled and cancelled (so only their outcomes stay), and
the memory left over the empty server's, over `count`, is the cost of one id remembered
(its `outcome` hash field and its `finished` zset entry). docs/service.md quotes it.

Several `--slots`: every row for each slot amount. Redis packs a key of up to 128 sorted-set
entries (512 hash fields) into one listpack, so a slot holding fewer pending messages costs far
less, while a batch of 1,000 spread over more slots takes more script calls:
`schedule_msg_per_s` (the scheduling loop, requests built inside it) and, beside the first slot
amount, `schedule_ratio_to_first_slots` (same payload and id, same run) say what that costs.

`--record-buckets`: every row again on a topic with `redis.recordBuckets` (the records in
buckets of about 48 that Redis packs as listpacks, docs/contracts.md §1), published by the
topic's owner; `--store-buckets`: again with `redis.storeBuckets` (the waiting messages' dues
in such buckets, with an index of each one's earliest due), and again with both.
`schedule_ratio_to_flat` is a row's scheduling rate over the same row's with neither.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import uuid
from typing import Any

import redis

from delayq.kube.builders.redis import redis_maxmemory
from delayq.local.redis_server import RedisServer
from delayq.queue import Queue, ScheduleRequest, Target, Topic

PAYLOADS = (32, 40, 256, 1024)
ID_LENGTHS = (12, 36)
LIMITS = ("512Mi", "1Gi", "4Gi")
BATCH = 1000
DAY_MS = 86_400_000
GIB = 1 << 30


def ids(count: int, length: int, rng: random.Random) -> list[str]:
    """`count` distinct ids of `length` bytes: UUIDs for 36, zero-padded numbers otherwise."""
    if length == 36:
        return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]
    return [f"{i:0{length}d}" for i in range(count)]


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def warm_up(queue: Queue) -> None:
    """Load the scripts before the baseline (FLUSHALL keeps them): otherwise the first row
    alone pays their few hundred KB, about 3 bytes per message of 100,000."""
    queue.schedule("warm-up", b"", delay_ms=DAY_MS)
    queue.cancel("warm-up")


def measure(
    client: redis.Redis,
    count: int,
    slots: int,
    payload_bytes: int,
    id_length: int,
    record_buckets: bool = False,
    store_buckets: bool = False,
) -> dict[str, Any]:
    client.flushall()
    topic = Topic(
        "memory",
        namespace="bench",
        slot_amount=slots,
        redis_record_buckets=record_buckets,
        redis_store_buckets=store_buckets,
    )
    queue = Queue(client, topic)
    if record_buckets or store_buckets:
        queue.publish_settings("bench", 1)  # as the topic's owner: the scripts obey the record
    warm_up(queue)
    baseline = used_memory(client)
    rng = random.Random(payload_bytes * 100 + id_length)
    payload = b"x" * payload_bytes
    message_ids = ids(count, id_length, rng)
    started = time.perf_counter()
    for start in range(0, count, BATCH):
        queue.schedule_many(
            [
                ScheduleRequest(message_id, payload, delay_ms=3_600_000 + rng.randrange(DAY_MS))
                for message_id in message_ids[start : start + BATCH]
            ]
        )
    schedule_s = time.perf_counter() - started
    assert queue.stats().scheduled == count
    per_message = (used_memory(client) - baseline) / count
    result: dict[str, Any] = {
        "record_buckets": record_buckets,
        "store_buckets": store_buckets,
        "slots": slots,
        "messages_per_slot": round(count / slots),
        "schedule_msg_per_s": round(count / schedule_s),
        "payload_bytes": payload_bytes,
        "id_bytes": id_length,
        "messages": count,
        "bytes_per_message": round(per_message),
        "overhead_bytes": round(per_message - payload_bytes - id_length),
        "messages_per_gib": int(GIB / per_message),
    }
    for limit in LIMITS:
        room = redis_maxmemory({"memory": limit}) - baseline
        result[f"messages_per_broker_at_{limit}"] = int(room / per_message)
    return result


def measure_outcome(client: redis.Redis, count: int, slots: int, id_length: int) -> dict[str, Any]:
    client.flushall()
    baseline = used_memory(client)
    topic = Topic("memory", namespace="bench", slot_amount=slots, outcome_retention_ms=DAY_MS)
    queue = Queue(client, topic)
    message_ids = ids(count, id_length, random.Random(id_length))
    for start in range(0, count, BATCH):
        chunk = message_ids[start : start + BATCH]
        queue.schedule_many([ScheduleRequest(i, b"", delay_ms=DAY_MS) for i in chunk])
        queue.cancel_many([Target(i) for i in chunk])
    assert queue.stats().scheduled == 0
    per_id = (used_memory(client) - baseline) / count
    return {
        "id_bytes": id_length,
        "remembered": count,
        "bytes_per_remembered_id": round(per_id),
        "remembered_per_gib": int(GIB / per_id),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="messages per measurement")
    parser.add_argument(
        "--slots", type=int, nargs="+", default=[16], help="slot amounts to measure (default 16)"
    )
    parser.add_argument(
        "--record-buckets",
        action="store_true",
        help="each row again with redis.recordBuckets on (schedule_ratio_to_msg: same run)",
    )
    parser.add_argument(
        "--store-buckets",
        action="store_true",
        help="each row again with redis.storeBuckets on, and with both on",
    )
    args = parser.parse_args()
    layouts = [(False, False)]
    if args.record_buckets:
        layouts.append((True, False))
    if args.store_buckets:
        layouts += [(False, True), (True, True)]
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        info = client.info("server")
        results = [
            measure(client, args.count, slots, payload, id_length, *layout)
            for slots in args.slots
            for payload in PAYLOADS
            for id_length in ID_LENGTHS
            for layout in layouts
        ]
        shape_of = ("payload_bytes", "id_bytes", "record_buckets", "store_buckets")
        rates = {
            (row["slots"], *(row[k] for k in shape_of)): row["schedule_msg_per_s"]
            for row in results
        }
        for row in results:
            shape = tuple(row[k] for k in shape_of)
            if len(args.slots) > 1:
                rate = rates[(args.slots[0], *shape)]
                row["schedule_ratio_to_first_slots"] = round(row["schedule_msg_per_s"] / rate, 2)
            if row["record_buckets"] or row["store_buckets"]:
                rate = rates[(row["slots"], *shape[:2], False, False)]
                row["schedule_ratio_to_flat"] = round(row["schedule_msg_per_s"] / rate, 2)
        outcomes = [measure_outcome(client, args.count, args.slots[0], n) for n in ID_LENGTHS]
        client.flushall()
        report = {
            "redis_version": info["redis_version"],
            "empty_used_memory": used_memory(client),
            "slots": args.slots,
            "maxmemory_of_limit": {limit: redis_maxmemory({"memory": limit}) for limit in LIMITS},
            "results": results,
            "outcomes": outcomes,
        }
        client.close()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
