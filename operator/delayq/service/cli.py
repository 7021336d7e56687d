"""The `serve` subcommand of `delayq` (registered by `delayq.cli`)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from delayq.service.config import ConfigError, ServiceConfig, add_arguments, check_exposure
from delayq.service.topic_file import read_topic_file


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="run one delay-service process (delivery, HTTP API, metrics)",
        description="Settings come from DELAYQ_* variables; flags override them.",
    )
    add_arguments(serve)
    serve.set_defaults(handler=run_serve)


def settings(args: argparse.Namespace) -> ServiceConfig:
    """The settings `add_arguments` parsed: the topic file, under DELAYQ_* variables, under the
    flags. Raises ConfigError."""
    base = read_topic_file(args.config, os.environ) if args.config else None
    return ServiceConfig.from_args(args, ServiceConfig.from_env(base=base))


def run_serve(args: argparse.Namespace) -> int:
    from delayq.service.serve import run

    try:
        config = settings(args)
        check_exposure(config)
    except ConfigError as error:
        print(f"delayq serve: {error}", file=sys.stderr)
        return 2
    return run(config)
