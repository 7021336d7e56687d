"""Test-only launcher: ``delayq operator`` with the Redis address map of ``RedisCommands``.

Pods do not run under KWOK, so the Redis "inside" a broker pod is a local redis-server. The
operator's ``RedisCommands`` has a TEST-ONLY ``addresses`` map for exactly this (pod IP or master
Service host -> local host and port, both for its connections and for the REPLICAOF targets it
sends), but ``delayq operator`` has no switch for it. This launcher runs the same
``delayq.kube.operator.run`` with a context whose map is read from a JSON file on every lookup, so
a test can re-point it while the operator runs (a pod that moved, a master that died).

    python3 e2e/operator_main.py --addresses FILE --liveness URL --namespace NS [--namespace ...]

Everything else comes from the ``DELAYQ_*`` environment, exactly as for ``delayq operator``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
from pathlib import Path


class FileAddresses:
    """A read-only mapping host -> (host, port) backed by a JSON file, re-read on every get.

    Reading a few hundred bytes per Redis call is negligible next to the call itself, and it
    means the test never has to signal the operator: rewriting the file is enough.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, host: str, default: tuple[str, int] | None = None) -> tuple[str, int] | None:
        """The local (host, port) that plays ``host``, or ``default`` when it is not mapped."""
        try:
            table = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return default
        # "*" catches hosts the test has not mapped (a pod that was just recreated): pointing
        # them at a closed local port makes them fail at once instead of after a timeout.
        entry = table.get(host) or table.get("*")
        return (str(entry[0]), int(entry[1])) if entry else default


def main() -> None:
    """Parse the few flags, then run the operator until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addresses", type=Path, required=True)
    parser.add_argument("--liveness", required=True)
    parser.add_argument("--metrics", default="")
    parser.add_argument("--namespace", action="append", dest="namespaces", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("E2E_OPERATOR_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    from delayq.kube.config import OperatorConfig
    from delayq.kube.context import OperatorContext
    from delayq.kube.operator import run
    from delayq.kube.redisctl import RedisCommands

    config = dataclasses.replace(
        OperatorConfig.from_env(), namespaces=tuple(args.namespaces), standalone=True,
        liveness_endpoint=args.liveness, metrics_endpoint=args.metrics)
    redis_control = RedisCommands(addresses=FileAddresses(args.addresses))  # type: ignore[arg-type]
    asyncio.run(run(config, ctx=OperatorContext.from_config(config, redis=redis_control)))

if __name__ == "__main__":
    main()
