"""The `delayq` command: one entry point, one subcommand group per component.

Each component owns a `register(subparsers)` that adds its group and sets `handler` (a function
of the parsed arguments returning the exit code) on every leaf parser. Adding a group is then a
one-line edit here, and a component's heavy imports (Spark, kopf, ...) stay inside its handlers,
so `delayq --help` is fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from delayq import __version__
from delayq.kube import cli as operator_cli
from delayq.local import cli as local_cli
from delayq.pipeline import cli as pipeline_cli
from delayq.service import admin_cli, routing_cli
from delayq.service import cli as service_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="delayq", description="Kubernetes-native delay queue.")
    parser.add_argument(
        "--version", action="version", version=f"delayq {__version__}", help="print the version"
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    pipeline_cli.register(subparsers)
    operator_cli.register(subparsers)
    service_cli.register(subparsers)
    local_cli.register(subparsers)
    admin_cli.register(subparsers)
    routing_cli.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    raise SystemExit(main())
