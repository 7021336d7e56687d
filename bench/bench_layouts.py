"""Where a pending message's Redis memory goes, and what other key layouts would take.

    python bench/bench_layouts.py [--count 100000] [--slots 16] [--payload 40] [--buckets 64]

Raw Redis commands on a throw-away redis-server, no engine: `count` pending messages (ids of 12
bytes, due times over a day) spread over `slots` slots by CRC32 as the engine spreads them, each
message written as the engine stores it — a `store` sorted set entry (id -> due ms) and a `msg`
hash field (id -> record, a fresh record without headers: `0:::0:` + payload, queue/codec.py) —
and each part measured on its own (`used_memory` before and after, over `count`), in two forms:

* `engine`: one key per part and slot, as today (docs/contracts.md §1): past the thresholds
  below Redis encodes it as a hashtable (hash) or skiplist (sorted set), with a 32-byte dict
  entry, a bucket pointer and separately allocated strings per member (and a skiplist node per
  sorted-set member);
* `buckets`: the part split into `buckets` keys per slot (the bucket a hash of the id independent
  of the slot's CRC32 — a CRC32 of the same id, even seeded differently, is affine in it and
  would fill only 1/`slots` of the buckets), each small enough to stay a listpack (Redis's
  packed encoding, up to `zset-max-listpack-entries` 128 entries of a sorted set and
  `hash-max-listpack-entries` 512 of a hash). A bucketed `store` also needs an index of
  the buckets' earliest due times (one sorted set of `buckets` entries per slot), counted in.

Only the layout is measured: no script here reads the bucketed forms (docs/benchmarks.md,
"Memory per pending message", says what the engine would need for them). JSON on stdout.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

from delayq.local.redis_server import RedisServer

DAY_MS = 86_400_000
BATCH = 1000
#: the encoding thresholds pinned at Redis's defaults (the broker pods set none)
CONFIG = {"hash-max-listpack-entries": "512", "zset-max-listpack-entries": "128"}

Writer = Callable[[Any, str, int, str], None]


def bucket_of(message_id: str, buckets: int) -> int:
    return int.from_bytes(hashlib.blake2b(message_id.encode(), digest_size=4).digest()) % buckets


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def measure(client: redis.Redis, count: int, slots: int, write: Writer) -> dict[str, Any]:
    """Bytes per message that `write` takes, and how many of the keys it made have each encoding
    (a bucket that outgrew its threshold is converted, and costs what the engine form does)."""
    client.flushall()
    before = used_memory(client)
    rng = random.Random(count)
    pipe = client.pipeline(transaction=False)
    for n in range(count):
        message_id = f"{n:012d}"
        tag = f"{{bench/layouts/{zlib.crc32(message_id.encode()) & (slots - 1)}}}"
        write(pipe, tag, 1_800_000_000_000 + rng.randrange(DAY_MS), message_id)
        if n % BATCH == BATCH - 1:
            pipe.execute()
    pipe.execute()
    per_message = (used_memory(client) - before) / count
    encodings = Counter(
        client.object("encoding", key).decode() for key in client.scan_iter(count=1000)
    )
    return {"bytes_per_message": round(per_message, 1), "keys_by_encoding": dict(encodings)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="pending messages")
    parser.add_argument("--slots", type=int, default=16, help="slots (a power of two)")
    parser.add_argument("--payload", type=int, default=40, help="payload bytes")
    parser.add_argument("--buckets", type=int, default=64, help="buckets per slot and part")
    args = parser.parse_args()
    record = b"0:::0:" + b"x" * args.payload
    buckets = args.buckets

    def store(pipe: Any, tag: str, due: int, message_id: str) -> None:
        pipe.zadd(f"dq:{tag}:store", {message_id: due})

    def msg(pipe: Any, tag: str, due: int, message_id: str) -> None:
        pipe.hset(f"dq:{tag}:msg", message_id, record)

    def store_buckets(pipe: Any, tag: str, due: int, message_id: str) -> None:
        bucket = bucket_of(message_id, buckets)
        pipe.zadd(f"dq:{tag}:store:{bucket}", {message_id: due})
        # the index of earliest dues: written as the engine would keep it (LT: only earlier)
        pipe.zadd(f"dq:{tag}:heads", {str(bucket): due}, lt=True)

    def msg_buckets(pipe: Any, tag: str, due: int, message_id: str) -> None:
        pipe.hset(f"dq:{tag}:msg:{bucket_of(message_id, buckets)}", message_id, record)

    with RedisServer(extra_config=CONFIG) as server:
        client = redis.Redis.from_url(server.url)
        parts = {
            "store": {"engine": store, "buckets": store_buckets},
            "msg": {"engine": msg, "buckets": msg_buckets},
        }
        results = {
            part: {form: measure(client, args.count, args.slots, w) for form, w in forms.items()}
            for part, forms in parts.items()
        }
        report = {
            "redis_version": client.info("server")["redis_version"],
            "config": CONFIG,
            "messages": args.count,
            "slots": args.slots,
            "payload_bytes": args.payload,
            "buckets_per_slot": buckets,
            "messages_per_bucket": round(args.count / args.slots / buckets, 1),
            "parts": results,
        }
        client.close()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
