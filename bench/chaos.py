"""Chaos soak of a `delayq serve` fleet: seeded overlapping faults, then the counting checker.

    python3 bench/chaos.py --minutes 30 --seed 7 > chaos.json

Real redis-server (AOF, appendfsync always), ZooKeeper (session timeout 4 s), three serve
processes of one 64-slot webhook topic (two under libfaketime, +5 s and -5 s) and a receiver in
this process; with `--pull` a pull topic and two long-polling consumers per serve process. The
fault menu, the plan and the rules live in `tests/chaos` (one place for the CI test and this
soak); see docs/reliability.md. Prints one JSON object: per fault kind the gap,
the p99 lateness of messages due in its windows and its duplicates, the rule totals (lost,
early, stalled, ...) and the seed. Exit status 1 when a rule broke.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root: tests.chaos

from tests.chaos.faults import KINDS
from tests.chaos.run import DENSE, ChaosOptions, run_chaos

from delayq.queue.topic import TopicType


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the fault phase")
    parser.add_argument("--seed", type=int, default=1, help="seeds the plan and the producer")
    parser.add_argument("--rate", type=float, default=40.0, help="messages scheduled per s")
    parser.add_argument("--max-delay-ms", type=int, default=8000, help="due times spread")
    parser.add_argument("--kinds", default=",".join(KINDS), help="fault kinds to draw from")
    parser.add_argument(
        "--moves", default="", help="steps to kill a slot move's mover in (freeze,copy,...)"
    )
    parser.add_argument("--split", default="", help="step to kill the doubling's splitter in")
    parser.add_argument("--keep-logs", action="store_true", help="keep the process logs")
    parser.add_argument(
        "--dense", action="store_true", help="the topic's records and dues in buckets"
    )
    parser.add_argument(
        "--pull", action="store_true", help="a pull topic leased by pull consumers, not a webhook"
    )
    args = parser.parse_args()
    options = ChaosOptions(
        seed=args.seed,
        fault_phase_s=args.minutes * 60,
        rate_per_s=args.rate,
        max_delay_ms=args.max_delay_ms,
        kinds=tuple(args.kinds.split(",")),
        moves=tuple(step for step in args.moves.split(",") if step),
        split=args.split,
        keep_logs=args.keep_logs,
        settings=DENSE if args.dense else {},
        delivery=TopicType.PULL if args.pull else TopicType.WEBHOOK,
    )
    result = asyncio.run(run_chaos(options))
    report = {**result.report, "logs": str(result.workdir) if result.workdir else None}
    print(json.dumps(report, indent=2, default=str))
    return 1 if result.verdict.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
