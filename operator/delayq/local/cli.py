"""The `dev` subcommand of `delayq` (registered by `delayq.cli`): the local quick start."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    dev = subparsers.add_parser(
        "dev",
        help="the local quick start: redis, (ZooKeeper,) three `delayq serve`, a live demo",
    )
    dev.add_argument("--duration", type=float, default=0.0, help="stop after N s (0: Ctrl-C)")
    dev.add_argument("--messages", type=int, default=20, help="demo messages to schedule")
    dev.add_argument("--rate", type=float, default=10.0, help="demo messages per second")
    dev.add_argument("--max-delay-ms", type=int, default=3000, help="demo delays up to this")
    dev.add_argument("--processes", type=int, default=3, help="`delayq serve` processes")
    dev.set_defaults(handler=run_dev)


def run_dev(args: argparse.Namespace) -> int:
    from delayq.local.dev import DevOptions, run

    return run(
        DevOptions(args.duration, args.messages, args.rate, args.max_delay_ms, args.processes)
    )
