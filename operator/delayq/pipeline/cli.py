"""`delayq pipeline ingest | archive | audit`: argument parsing and wiring, nothing else.

Spark and pyarrow are imported inside the handlers (the modules imported here load neither),
so the rest of the CLI starts fast; they come with the `pipeline` extra, and a command whose
modules are missing says so in one line (exit code 2).
Each command prints a human line on stderr and its summary as one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from delayq.extras import missing_extra
from delayq.pipeline.archive import DEFAULT_PAGE_SIZE
from delayq.pipeline.ingest import FORMATS
from delayq.pipeline.spark import DEFAULT_MASTER
from delayq.queue.topic import DEFAULT_MAX_PAYLOAD_BYTES

DEFAULT_GRACE_MS = 60_000
REDIS_URL_ENV = "DELAYQ_REDIS_URL"
EXTRA = "pipeline"
SPARK = ("pyspark",)  # what a command imports from the `pipeline` extra
ARROW = ("pyarrow",)


def register(subparsers: Any) -> None:
    """Add the `pipeline` group to the top-level `delayq` parser."""
    group = subparsers.add_parser("pipeline", help="batch jobs: ingest, archive, audit")
    commands = group.add_subparsers(dest="pipeline_command", required=True)

    ingest = commands.add_parser("ingest", help="bulk-schedule messages from a file")
    _topic_arguments(ingest)
    ingest.add_argument("--max-payload-bytes", type=int, default=DEFAULT_MAX_PAYLOAD_BYTES)
    ingest.add_argument(
        "--journal-maxlen",
        type=int,
        default=0,
        help="the topic's journal bound (0 = off); pass the topic's value to journal the ingest",
    )
    ingest.add_argument("--input", required=True, help="file or directory to read")
    ingest.add_argument("--format", required=True, choices=FORMATS)
    ingest.add_argument(
        "--map",
        default="",
        help="column mapping NAME=COLUMN,... for id, payload, due_at, delay, slot_basis, headers",
    )
    ingest.add_argument("--rejects", required=True, help="directory for rejected rows (JSON)")
    ingest.add_argument("--partitions", type=int, default=None, help="writer tasks")
    ingest.add_argument("--master", default=DEFAULT_MASTER)
    ingest.set_defaults(handler=_reporting_errors("ingest", run_ingest, SPARK))

    archive = commands.add_parser("archive", help="append the lifecycle journal to Parquet")
    _topic_arguments(archive)
    archive.add_argument("--output", required=True, help="Parquet dataset directory")
    archive.add_argument("--checkpoint", required=True, help="directory of checkpoint files")
    archive.add_argument(
        "--page-size", type=int, default=DEFAULT_PAGE_SIZE, help="entries per XRANGE and file"
    )
    archive.set_defaults(handler=_reporting_errors("archive", run_archive, ARROW))

    audit = commands.add_parser("audit", help="delivery report over the archived journal")
    audit.add_argument("--input", required=True, help="the archive's Parquet dataset")
    audit.add_argument("--output", required=True, help="directory for audit.json, audit.html")
    audit.add_argument("--grace-ms", type=int, default=DEFAULT_GRACE_MS)
    audit.add_argument("--master", default=DEFAULT_MASTER)
    audit.set_defaults(handler=_reporting_errors("audit", run_audit, SPARK))


Handler = Callable[[argparse.Namespace], int]


def _reporting_errors(command: str, handler: Handler, modules: tuple[str, ...]) -> Handler:
    """A missing extra or a configuration error (bad mapping, topic setting) is one line and
    exit code 2."""

    def run(args: argparse.Namespace) -> int:
        from delayq.pipeline.transforms import MappingError
        from delayq.queue.topic import TopicError

        if (missing := missing_extra(EXTRA, modules)) is not None:
            print(f"delayq pipeline {command}: {missing}", file=sys.stderr)
            return 2
        try:
            return handler(args)
        except (MappingError, TopicError) as error:
            print(f"delayq pipeline {command}: {error}", file=sys.stderr)
            return 2

    return run


def _topic_arguments(parser: argparse.ArgumentParser) -> None:
    url = os.environ.get(REDIS_URL_ENV)
    parser.add_argument(
        "--redis",
        required=url is None,
        default=url,
        help=f"redis://[:password@]host:port/db (default ${REDIS_URL_ENV}: keeps a password "
        "out of the process list)",
    )
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--slots", type=int, required=True, help="the topic's slotAmount")


def _emit(line: str, summary: dict[str, Any]) -> None:
    from delayq.pipeline.ingest import stderr_report

    stderr_report(line)
    print(json.dumps(summary, sort_keys=True))


def run_ingest(args: argparse.Namespace) -> int:
    from delayq.pipeline import transforms
    from delayq.pipeline.ingest import ingest, read_input, stderr_report
    from delayq.pipeline.io_redis import RedisTarget
    from delayq.pipeline.spark import job_session

    target = RedisTarget(
        args.redis,
        args.namespace,
        args.topic,
        args.slots,
        args.max_payload_bytes,
        args.journal_maxlen,
    )
    target.to_topic()  # validates the names and bounds before Spark starts
    mapping = transforms.parse_mapping(args.map)
    with job_session(args.master, "delayq-pipeline-ingest") as spark:
        source = read_input(spark, args.input, args.format)
        summary = ingest(
            spark, source, target, args.rejects, mapping, args.partitions, report=stderr_report
        )
    _emit(summary.line(), summary.as_dict())
    return 0


def run_archive(args: argparse.Namespace) -> int:
    from delayq.pipeline.archive import archive
    from delayq.queue.topic import Topic

    topic = Topic(args.topic, namespace=args.namespace, slot_amount=args.slots)
    summary = archive(args.redis, topic, args.output, args.checkpoint, args.page_size)
    _emit(summary.line(), summary.as_dict())
    return 0


def run_audit(args: argparse.Namespace) -> int:
    from delayq.pipeline.audit_job import run
    from delayq.pipeline.spark import job_session

    with job_session(args.master, "delayq-pipeline-audit") as spark:
        report = run(spark, args.input, args.output, args.grace_ms)
    _emit(f"audit: wrote {args.output}/audit.json and audit.html", report)
    return 0
