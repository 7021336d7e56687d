"""The `serve` and `dev` subcommands of `delayq` (registered by `delayq.cli`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from delayq.service.config import ConfigError, ServiceConfig, add_arguments
from delayq.service.topic_file import read_topic_file


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run one delay-service process (delivery, HTTP API, metrics)",
        description="Settings come from DELAYQ_* variables; flags override them.",
    )
    add_arguments(serve)
    serve.set_defaults(handler=run_serve)

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


def run_serve(args: argparse.Namespace) -> int:
    from delayq.service.serve import run

    try:
        base = read_topic_file(args.config, os.environ) if args.config else None
        config = ServiceConfig.from_args(args, ServiceConfig.from_env(base=base))
    except ConfigError as error:
        print(f"delayq serve: {error}", file=sys.stderr)
        return 2
    return run(config)


def run_dev(args: argparse.Namespace) -> int:
    from delayq.service.dev import DevOptions, run

    return run(
        DevOptions(args.duration, args.messages, args.rate, args.max_delay_ms, args.processes)
    )
