"""`delayq operator`: run the DelayTopic operator (kopf) with settings from env and flags.

kopf comes with the `operator` extra; without it the command is a one-line error (exit code 2).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import sys
from typing import Any

from delayq.extras import missing_extra

LEADERSHIP_LOST_EXIT_CODE = 3


def register(subparsers: Any) -> None:
    """Add the `operator` command; flags override the DELAYQ_* environment the chart sets."""
    parser = subparsers.add_parser("operator", help="run the DelayTopic Kubernetes operator")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch this namespace (repeatable; default: DELAYQ_WATCH_NAMESPACES or all)",
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="no leader election: only when no other operator replica can run",
    )
    parser.add_argument("--lease-name", help="the leader Lease shared by the replicas")
    parser.add_argument(
        "--liveness", help="liveness endpoint URL, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument(
        "--metrics", help="Prometheus endpoint URL, e.g. http://0.0.0.0:8081/metrics ('' off)"
    )
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.add_argument("--json-logs", action="store_true", help="one JSON object per log line")
    parser.set_defaults(handler=run_operator)


def run_operator(args: argparse.Namespace) -> int:
    if (missing := missing_extra("operator", ("kopf",))) is not None:
        print(f"delayq operator: {missing}", file=sys.stderr)
        return 2
    import kopf

    from delayq.kube.config import OperatorConfig
    from delayq.kube.leader_election import LeadershipLost
    from delayq.kube.operator import run

    log_format = kopf.LogFormat.JSON if args.json_logs else kopf.LogFormat.FULL
    kopf.configure(verbose=args.verbose, log_format=log_format)
    config = OperatorConfig.from_env()
    changes: dict[str, Any] = {}
    if args.namespaces:
        changes["namespaces"] = tuple(args.namespaces)
    if args.all_namespaces:
        changes["namespaces"] = ()
    if args.standalone:
        changes["standalone"] = True
    if args.lease_name:
        changes["leader_lease_name"] = args.lease_name
    if args.liveness:
        changes["liveness_endpoint"] = args.liveness
    if args.metrics is not None:
        changes["metrics_endpoint"] = args.metrics

    async def operate() -> None:
        try:
            await run(dataclasses.replace(config, **changes))
        except LeadershipLost as lost:
            # Exit at once, from inside the loop: asyncio.run's teardown would wait for what the
            # old leader still has in flight (a worker thread, a handler) while a replacement
            # may already act. The pod restarts and campaigns again as a new candidate.
            logging.getLogger(__name__).error("lost the leadership (%s): exiting", lost)
            logging.shutdown()
            os._exit(LEADERSHIP_LOST_EXIT_CODE)

    asyncio.run(operate())
    return 0
