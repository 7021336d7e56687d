"""`delayq pipeline ingest | archive | audit`: argument parsing and wiring, nothing else.

Spark and pyarrow are imported inside the handlers (the modules imported here load neither),
so the rest of the CLI starts fast; they come with the `pipeline` extra, and a command whose
modules are missing says so in one line (exit code 2).
Each command prints a human line on stderr and its summary as one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from delayq.extras import missing_extra
from delayq.pipeline.archive import DEFAULT_PAGE_SIZE
from delayq.pipeline.ingest import FORMATS
from delayq.pipeline.spark import FALLBACK_MASTER
from delayq.queue.topic import DEFAULT_MAX_PAYLOAD_BYTES
from delayq.service.admin_cli import non_negative, positive

if TYPE_CHECKING:
    from delayq.coordination.routed_queue import RoutedQueue
    from delayq.coordination.routing_watch import ZkConnection
    from delayq.pipeline.io_redis import RedisTarget

DEFAULT_GRACE_MS = 60_000
REDIS_URL_ENV = "DELAYQ_REDIS_URL"
BROKER_URLS_ENV = "DELAYQ_BROKER_URLS"  # as `delayq serve`: comma-separated, broker index order
# The settings of `delayq serve` a routed job takes, with its flags and variables: where the
# topic's routing node is, the topic's ZooKeeper identity (its password) and TLS.
ZOOKEEPER_SETTINGS = (
    "zookeeper_connect",
    "zookeeper_password",
    "zookeeper_tls",
    "zookeeper_tls_ca_file",
    "zookeeper_tls_cert_file",
    "zookeeper_tls_key_file",
    "zookeeper_tls_verify_certs",
)
EXTRA = "pipeline"
SPARK = ("pyspark",)  # what a command imports from the `pipeline` extra
ARROW = ("pyarrow",)
SPARK_ARROW = ("pyspark", "pyarrow", "pandas")  # mapInArrow: pyspark checks for pandas


def register(subparsers: Any) -> None:
    """Add the `pipeline` group to the top-level `delayq` parser."""
    group = subparsers.add_parser("pipeline", help="batch jobs: ingest, archive, audit")
    commands = group.add_subparsers(dest="pipeline_command", required=True)

    ingest = commands.add_parser("ingest", help="bulk-schedule messages from a file")
    _topic_arguments(ingest)
    _limit_arguments(ingest)
    ingest.add_argument("--input", required=True, help="file or directory to read")
    ingest.add_argument(
        "--format", required=True, choices=FORMATS, help="input format (json = JSON Lines)"
    )
    ingest.add_argument(
        "--map",
        default="",
        help="column mapping NAME=COLUMN,... for id, payload, due_at, delay, slot_basis, headers, "
        "priority, group",
    )
    ingest.add_argument("--rejects", required=True, help="directory for rejected rows (JSON)")
    ingest.add_argument(
        "--partitions",
        type=positive,
        default=None,
        help="writer tasks (default: 4 per core, at most one per slot)",
    )
    _master_argument(ingest)
    ingest.set_defaults(handler=_reporting_errors("ingest", run_ingest, SPARK_ARROW))

    archive = commands.add_parser("archive", help="append the lifecycle journal to Parquet")
    _topic_arguments(archive)
    archive.add_argument("--output", required=True, help="Parquet dataset directory")
    archive.add_argument("--checkpoint", required=True, help="directory of checkpoint files")
    archive.add_argument(
        "--page-size", type=positive, default=DEFAULT_PAGE_SIZE, help="entries per XRANGE and file"
    )
    archive.set_defaults(handler=_reporting_errors("archive", run_archive, ARROW))

    backup = commands.add_parser("backup", help="snapshot a topic's pending state to Parquet")
    _topic_arguments(backup)
    where = backup.add_mutually_exclusive_group(required=True)
    where.add_argument("--output", help="a new directory for the backup")
    where.add_argument(
        "--into",
        help="a local directory of backups: this one goes into a new directory named by its "
        "start (UTC), then the oldest beyond --keep are deleted (scheduled backups)",
    )
    backup.add_argument(
        "--keep",
        type=positive,
        default=None,
        help="with --into: complete backups kept, the newest (default: all)",
    )
    _store_argument(backup)
    _master_argument(backup)
    backup.set_defaults(handler=_reporting_errors("backup", run_backup, SPARK_ARROW))

    restore = commands.add_parser("restore", help="restore a backup into a topic, create-only")
    _topic_arguments(restore)
    _limit_arguments(restore)
    restore.add_argument(
        "--limits-max-pending",
        type=non_negative,
        default=0,
        help="the topic's limits.maxPending (0 = none): messages beyond it are not restored",
    )
    restore.add_argument("--input", required=True, help="the backup's directory")
    restore.add_argument(
        "--shift",
        type=_shift,
        default=0,
        help="move every instant this much later (500ms, 90s, 30m, 24h, 7d): a drill that "
        "shows what will fire then (default: none)",
    )
    restore.add_argument(
        "--replay",
        default=None,
        help="the topic's journal archive (`archive --output`): after restoring, cancel what "
        "finished since each slot was read and move what was rescheduled, and report what "
        "it cannot restore; the topic's delivery is paused meanwhile (resumed at the end "
        "unless it was paused before; kept if the restore fails after it began writing)",
    )
    _store_argument(restore)
    _master_argument(restore)
    restore.set_defaults(handler=_reporting_errors("restore", run_restore, SPARK_ARROW))

    audit = commands.add_parser("audit", help="delivery report over the archived journal")
    audit.add_argument("--input", required=True, help="the archive's Parquet dataset")
    audit.add_argument("--output", required=True, help="directory for audit.json, audit.html")
    audit.add_argument(
        "--grace-ms",
        type=non_negative,
        default=DEFAULT_GRACE_MS,
        help="a waiting id counts as lost once its due is this far before the journal's end "
        "(default %(default)s)",
    )
    _master_argument(audit)
    audit.set_defaults(handler=_reporting_errors("audit", run_audit, SPARK))


def _limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The topic settings a writing job (ingest, restore) obeys where the brokers hold no settings
    record (the record, published by the topic's owner, wins: queue/topic_record.py)."""
    parser.add_argument(
        "--max-payload-bytes",
        type=int,
        default=DEFAULT_MAX_PAYLOAD_BYTES,
        help="the topic's payload limit: larger payloads are rejected (default %(default)s)",
    )
    parser.add_argument(
        "--journal-max-len",
        type=int,
        default=0,
        help="the topic's journal bound, used only where the brokers hold no settings record "
        "(an operator of an earlier version; the record wins): deprecated, kept for one release",
    )
    parser.add_argument(
        "--outcome-retention-ms",
        type=int,
        default=0,
        help="the topic's outcomeRetention in ms, used only where the brokers hold no settings "
        "record (the record's retention wins): deprecated, kept for one release",
    )


Handler = Callable[[argparse.Namespace], int]


class JobError(Exception):
    """A job cannot run (Redis unreachable, input unreadable): one line, exit code 1."""


#: What Spark takes as a master (`SparkMasterRegex` and the cluster managers): local, local[N|*],
#: local[N|*,F], local-cluster[N,C,M], yarn, or a URL (spark://, k8s://, a plugin's scheme).
MASTER = re.compile(
    r"local(\[([0-9]+|\*)(\s*,\s*[0-9]+)?\])?"
    r"|local-cluster\[\s*[0-9]+\s*,\s*[0-9]+\s*,\s*[0-9]+\s*\]"
    r"|yarn|[a-z][a-z0-9+.-]*://.+"
)


def _master(text: str) -> str:
    """argparse type of `--master`: refused before the JVM starts, where Spark's own refusal
    is a Java stack trace and then a Python one."""
    if not MASTER.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a Spark master: local[N], spark://host:port, k8s://..., yarn"
        )
    return text


def _master_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master",
        type=_master,
        default=None,
        help="Spark master (local[4], spark://host:7077, k8s://...); default: what spark-submit "
        f"or spark-defaults.conf set, else {FALLBACK_MASTER}",
    )


def _store_argument(parser: argparse.ArgumentParser) -> None:
    from delayq.pipeline.object_store import ENDPOINT_ENV

    parser.add_argument(
        "--s3-endpoint",
        default=None,
        help="for s3a:// paths on an S3-compatible store: its URL (http://minio:9000), "
        f"path-style access (default ${ENDPOINT_ENV[0]}, else ${ENDPOINT_ENV[1]}; none: AWS). "
        "Credentials: $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY",
    )


def _reporting_errors(command: str, handler: Handler, modules: tuple[str, ...]) -> Handler:
    """A missing extra or a configuration error (bad mapping, topic setting) is one line and
    exit code 2; a job that cannot run (Redis unreachable, input missing) one line and exit
    code 1. Never a traceback for these."""

    def run(args: argparse.Namespace) -> int:
        from delayq.coordination.routed_queue import RoutingError
        from delayq.pipeline.object_store import StoreError
        from delayq.pipeline.transforms import MappingError
        from delayq.queue.topic import TopicError
        from delayq.service.config import ConfigError

        if (missing := missing_extra(EXTRA, modules)) is not None:
            print(f"delayq pipeline {command}: {missing}", file=sys.stderr)
            return 2
        try:
            return handler(args)
        except (MappingError, TopicError, RoutingError, ConfigError) as error:
            print(f"delayq pipeline {command}: {error}", file=sys.stderr)
            return 2
        except (JobError, StoreError) as error:
            print(f"delayq pipeline {command}: {error}", file=sys.stderr)
            return 1
        except Exception as error:
            if (line := _known_failure(error, args)) is None:
                raise
            print(f"delayq pipeline {command}: {line}", file=sys.stderr)
            return 1

    return run


def _known_failure(error: Exception, args: argparse.Namespace) -> str | None:
    """One line for the failures an operator fixes outside the code: Redis or ZooKeeper not
    reachable or refusing, a path Spark cannot read. Anything else keeps its traceback (it is a
    bug)."""
    import redis
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    url = ", ".join(map(redacted, getattr(args, "redis", None) or []))
    if isinstance(error, KazooException | KazooTimeoutError):
        hosts = getattr(args, "zookeeper_connect", None) or ""
        return f"cannot read the routing from ZooKeeper {hosts}: {_first_line(error)}"
    if isinstance(error, redis.ConnectionError | redis.TimeoutError):
        return f"cannot reach Redis at {url}: {_first_line(error)}"
    if isinstance(error, redis.AuthenticationError | redis.ResponseError):
        return f"Redis at {url} refused: {_first_line(error)}"
    if "pyspark" in sys.modules:
        from pyspark.errors import AnalysisException, PythonException

        if isinstance(error, PythonException) and (moved := TASK_MOVED.search(str(error))):
            return f"{moved.group(1)}: run it again (it follows the new routing)"
        if isinstance(error, AnalysisException):
            if "PATH_NOT_FOUND" in str(error):
                return f"cannot read --input {getattr(args, 'input', '')}: {_first_line(error)}"
            return _first_line(error)
    return None


#: A task's error of a slot that moved (or slots that doubled) while a job ran: the job stops,
#: and running it again follows the new routing (the worker's traceback ends with this line).
TASK_MOVED = re.compile(r"^\S*(?:SlotMovedError|SlotMovingError): (.*)$", re.MULTILINE)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def redacted(url: str) -> str:
    """The Redis URL without its password, for messages; the host and port as written (a bad
    port must not fail the message naming it)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:  # a broken IPv6 address: nothing can be told apart from the password
        return "<a URL that does not parse>"
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def _check_url(url: str) -> None:
    """A Redis URL redis-py can connect with, else a configuration error naming it (redis-py's
    ValueError would be a traceback)."""
    import redis

    from delayq.service.config import ConfigError

    try:
        redis.Redis.from_url(url).close()  # parses only: connecting is _check_redis's
    except ValueError as error:
        raise ConfigError(f"--redis {redacted(url)}: {error}") from None


def _check_redis(url: str) -> None:
    """PING the topic's Redis from the driver, so an unreachable one fails in a second, before
    Spark starts (the executors, which write, must reach it too)."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=5)
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError) as error:
        raise JobError(f"cannot reach Redis at {redacted(url)}: {_first_line(error)}") from error
    finally:
        client.close()


def _check_input(path: str) -> None:
    """A local input that does not exist fails before Spark starts; remote paths (hdfs://,
    s3a://, ...) and glob patterns are Spark's to read."""
    if any(char in path for char in "*?[{"):
        return
    local = _local(path)
    if local is not None and not os.path.exists(local):
        raise JobError(f"cannot read --input {path}: no such file or directory")


def _local(path: str) -> str | None:
    """The filesystem path of a local `path` (plain or file://), None for a remote one."""
    from urllib.parse import urlsplit

    parts = urlsplit(path)
    if parts.scheme == "file":
        return parts.path
    return path if parts.scheme == "" else None


def _check_rejects(rejects: str, input_path: str) -> None:
    """Ingest writes the rejects with Spark's overwrite mode, which deletes whatever is at the
    path first: a local `--rejects` that holds anything but an earlier rejects output (Spark's
    part files and markers), or that contains the input, is refused before Spark starts. A
    mistyped `--rejects /data` would otherwise delete /data, after the ingest."""
    from delayq.service.config import ConfigError

    local = _local(rejects)
    if local is None:
        return
    target = os.path.realpath(local)
    source = _local(input_path)
    if source is not None and os.path.commonpath([target, os.path.realpath(source)]) == target:
        raise ConfigError(f"--rejects {rejects} holds the --input: give a directory of its own")
    if os.path.isfile(target):
        raise ConfigError(f"--rejects {rejects} is a file: give a directory of its own")
    if not os.path.isdir(target):
        return
    spark_output = ("part-", "_SUCCESS", ".part-", "._SUCCESS")
    other = sorted(name for name in os.listdir(target) if not name.startswith(spark_output))
    if other:
        raise ConfigError(
            f"--rejects {rejects} holds other files ({other[0]!r}, ...), which writing the "
            "rejects would delete: give a directory of its own"
        )


def _check_hosts(hosts: str) -> None:
    """A ZooKeeper connect string kazoo can parse, else a configuration error naming it
    (kazoo's ValueError, for a port that is not a number, would be a traceback)."""
    from kazoo.hosts import collect_hosts

    from delayq.service.config import ConfigError

    try:
        collect_hosts(hosts)
    except ValueError as error:
        raise ConfigError(f"--zookeeper-connect {hosts}: {error}") from None


def _topic_arguments(parser: argparse.ArgumentParser) -> None:
    from delayq.service.config import add_arguments

    parser.add_argument(
        "--redis",
        action="append",
        help="redis://[:password@]host:port/db of a broker; once per broker, in broker index "
        f"order (default ${BROKER_URLS_ENV}, comma-separated, else ${REDIS_URL_ENV}: keeps a "
        "password out of the process list). More than one needs the routing: "
        "--zookeeper-connect",
    )
    parser.add_argument(
        "--config",
        help="the topic's topic.json as the operator writes it (ConfigMap <topic>-config): "
        "namespace, topic, slots, brokers and ZooKeeper, the passwords from "
        "$DELAYQ_REDIS_PASSWORD and $DELAYQ_ZOOKEEPER_PASSWORD; flags given win",
    )
    parser.add_argument("--namespace", help="the topic's namespace (default: default)")
    parser.add_argument("--topic", help="the topic's name (required without --config)")
    parser.add_argument(
        "--slots", type=int, help="the topic's slotAmount (required without --config)"
    )
    add_arguments(parser, ZOOKEEPER_SETTINGS)


def _env_urls() -> list[str]:
    """$DELAYQ_BROKER_URLS (comma-separated), else $DELAYQ_REDIS_URL, else none."""
    return [url for url in os.environ.get(BROKER_URLS_ENV, "").split(",") if url] or [
        url for url in [os.environ.get(REDIS_URL_ENV, "")] if url
    ]


def _from_topic_file(args: argparse.Namespace) -> None:
    """Fill what the flags left unset from `--config` (the operator's topic.json, as
    `delayq serve --config` reads it), then require the topic's name and slot amount."""
    from delayq.service.config import ConfigError
    from delayq.service.topic_file import read_topic_file

    if args.config:
        settings = read_topic_file(args.config, os.environ)
        args.namespace = args.namespace or settings["namespace"]
        args.topic = args.topic or settings["topic"]
        args.slots = args.slots or settings["slot_amount"]
        # the file's brokers as the service user, unless flags or the environment name them
        # (the scheduled backups log in as the read-only backup user: DELAYQ_BROKER_URLS)
        args.redis = args.redis or _env_urls() or settings["broker_urls"].split(",")
        for name in ZOOKEEPER_SETTINGS:
            if getattr(args, name, None) is None and name in settings:
                setattr(args, name, settings[name])
    args.namespace = args.namespace or "default"
    if args.topic is None or args.slots is None:
        raise ConfigError("give the topic: --topic and --slots, or --config (its topic.json)")


def _brokers(args: argparse.Namespace) -> tuple[tuple[str, ...], ZkConnection | None]:
    """The topic's broker URLs (flags, else the environment) and where its routing is (the
    ZooKeeper settings of `delayq serve`: flags over DELAYQ_* variables)."""
    from delayq.service.config import ConfigError, ServiceConfig

    _from_topic_file(args)
    urls = args.redis or _env_urls()
    if not urls:
        raise ConfigError(f"give the topic's Redis: --redis (${BROKER_URLS_ENV}, ${REDIS_URL_ENV})")
    for url in urls:
        _check_url(url)
    args.redis = urls  # for the messages
    zookeeper = ServiceConfig.from_args(args).zookeeper_connection
    if zookeeper is not None:
        _check_hosts(zookeeper.hosts)
    if len(urls) > 1 and zookeeper is None:
        raise ConfigError(
            f"{len(urls)} brokers need their slot routing, from ZooKeeper: give "
            "--zookeeper-connect (DELAYQ_ZOOKEEPER_CONNECT)"
        )
    return tuple(urls), zookeeper


def _routed(
    args: argparse.Namespace, urls: tuple[str, ...], zookeeper: ZkConnection | None
) -> RoutedQueue:
    """The routed client of the topic, checked from the driver before any job starts: the
    routing is there and names only brokers given (RoutingError: exit code 2), and every broker
    answers a PING (JobError: exit code 1)."""
    from delayq.coordination.routed_queue import RoutedQueue, RoutingError
    from delayq.queue.topic import Topic

    topic = Topic(args.topic, namespace=args.namespace, slot_amount=args.slots)
    # kazoo logs every failed connection attempt; the failure is reported once, in one line
    logging.getLogger("kazoo").setLevel(logging.CRITICAL)
    for url in urls:
        _check_redis(url)
    routed = RoutedQueue.connect(urls, topic, zookeeper=zookeeper)
    if zookeeper is None:
        try:
            _check_not_frozen(routed)
        except RoutingError:
            routed.close()
            raise
    return routed


def _check_not_frozen(routed: RoutedQueue) -> None:
    """Without ZooKeeper the job takes the topic's keys as `--slots` names them (key
    generation 0, every slot on the one broker): refused when that broker holds a slot's
    frozen epoch instead, the tombstone a doubling of the slots (or a slot moved away, a
    doubling under way) leaves. Archive would otherwise find no journal and export nothing,
    run after run, while the new generation's journals are trimmed unarchived; ingest would
    wait out SLOT_MOVING on every row."""
    from delayq.coordination.routed_queue import RoutingError
    from delayq.queue.keys import Part, slot_keys

    topic, read = routed.topic, routed.queues[0].redis.pipeline(transaction=False)
    for slot in topic.slots:  # GET, not MGET: the topic's restricted Redis user (ingest's) may
        read.get(slot_keys(topic, slot).key(Part.EPOCH))  # run only the engine's commands
    epochs = read.execute()
    frozen = [slot for slot, epoch in enumerate(epochs) if epoch and epoch[:7] == b"moving:"]
    if frozen:
        raise RoutingError(
            f"slot {frozen[0]} of {topic.slot_amount} is frozen on this broker ({len(frozen)} "
            "slots): the slots doubled or moved, or are doing so; give --zookeeper-connect "
            "(DELAYQ_ZOOKEEPER_CONNECT) to follow the topic's routing"
        )


def _emit(line: str, summary: dict[str, Any]) -> None:
    from delayq.pipeline.ingest import stderr_report

    stderr_report(line)
    print(json.dumps(summary, sort_keys=True))


def run_ingest(args: argparse.Namespace) -> int:
    from delayq.pipeline import transforms
    from delayq.pipeline.ingest import ingest, read_input, stderr_report
    from delayq.pipeline.spark import job_session

    target = _target(args)
    mapping = transforms.parse_mapping(args.map)
    _check_input(args.input)
    _check_rejects(args.rejects, args.input)
    _checked_brokers(args, target)
    with job_session(args.master, "delayq-pipeline-ingest") as spark:
        source = read_input(spark, args.input, args.format)
        summary = ingest(
            spark, source, target, args.rejects, mapping, args.partitions, report=stderr_report
        )
    _emit(summary.line(), summary.as_dict())
    return 0


def run_archive(args: argparse.Namespace) -> int:
    from delayq.pipeline.archive import archive

    with _routed(args, *_brokers(args)) as brokers:
        summary = archive(brokers, args.output, args.checkpoint, args.page_size)
    _emit(summary.line(), summary.as_dict())
    return 0


SHIFT = re.compile(r"(?:[0-9]{1,8}(?:ms|s|m|h|d))+")
SHIFT_PART = re.compile(r"([0-9]+)(ms|s|m|h|d)")
SHIFT_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _shift(text: str) -> int:
    """argparse type of `--shift`: a duration (Go style, plus days) in ms, never negative (a
    restore delivers nothing earlier than its original due)."""
    from delayq.queue.topic import MAX_DELAY_MS

    if not SHIFT.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration such as 500ms, 90s, 30m, 24h or 7d (never negative)"
        )
    total = sum(int(n) * SHIFT_UNIT_MS[unit] for n, unit in SHIFT_PART.findall(text))
    if total > MAX_DELAY_MS:
        raise argparse.ArgumentTypeError(f"{text!r} is beyond the maximum delay (20 years)")
    return total


def _target(args: argparse.Namespace) -> RedisTarget:
    """The topic's brokers, where its routing is and the settings a job obeys; the names and
    bounds checked (exit code 2) before Spark starts."""
    from delayq.pipeline.io_redis import RedisTarget

    urls, zookeeper = _brokers(args)
    target = RedisTarget(
        urls,
        args.namespace,
        args.topic,
        args.slots,
        getattr(args, "max_payload_bytes", DEFAULT_MAX_PAYLOAD_BYTES),
        getattr(args, "journal_max_len", 0),
        getattr(args, "outcome_retention_ms", 0),
        zookeeper,
        getattr(args, "limits_max_pending", 0),
    )
    target.to_topic()
    return target


def _checked_brokers(args: argparse.Namespace, target: RedisTarget) -> None:
    """The routing (exit code 2) and every broker (exit code 1), checked before Spark starts."""
    _routed(args, target.urls, target.zookeeper).close()


def _check_topic_exists(target: RedisTarget) -> None:
    """A backup of a topic no broker holds a key of (a mistyped name, namespace or --slots) is
    refused rather than written empty: EXISTS over every slot's keys, per broker."""
    from delayq.queue.backup import SNAPSHOT_PARTS
    from delayq.queue.keys import slot_keys
    from delayq.service.config import ConfigError

    with target.connect() as routed:
        topic, found = routed.topic, 0
        for queue in routed.queues:
            read = queue.redis.pipeline(transaction=False)
            for slot in topic.slots:
                read.exists(*slot_keys(topic, slot).keys(*SNAPSHOT_PARTS))
            found += sum(read.execute())
    if not found:
        raise ConfigError(
            f"topic {target.namespace}/{target.topic} ({target.slot_amount} slots) has no key "
            "on its brokers: check --namespace, --topic and --slots"
        )


def _check_new_output(output: str) -> None:
    from delayq.service.config import ConfigError

    local = _local(output)
    if local is not None and os.path.exists(local):
        raise ConfigError(f"--output {output} exists: give a new directory for the backup")


def _check_backup(path: str) -> None:
    """A local backup directory without its items or manifest fails before Spark starts."""
    from delayq.pipeline.backup import ITEMS, MANIFEST

    local = _local(path)
    if local is None:
        return
    for part in (ITEMS, MANIFEST):
        if not os.path.isdir(os.path.join(local, part)):
            raise JobError(f"cannot read --input {path}: no backup there (no {part}/)")


def _use_store(
    spark: Any, args: argparse.Namespace, path: str, option: str, parts: tuple[str, ...]
) -> None:
    """An s3a:// path: the session gets the store's S3A settings, and the path is checked from
    the driver (new for a backup, holding `parts` for a restore) before the job starts."""
    from delayq.pipeline import object_store

    if object_store.is_s3a(path):
        object_store.configure(spark, object_store.s3a_settings(args.s3_endpoint, os.environ))
        object_store.check(spark, path, option, parts, os.environ)


def run_backup(args: argparse.Namespace) -> int:
    from delayq.pipeline import retention
    from delayq.pipeline.backup import backup
    from delayq.pipeline.spark import job_session
    from delayq.service.config import ConfigError

    if args.keep is not None and args.into is None:
        raise ConfigError("--keep goes with --into (a directory of backups)")
    into = None if args.into is None else _local(args.into)
    if args.into is not None and into is None:
        raise ConfigError(f"--into {args.into}: give a local directory (a mounted volume)")
    output = args.output if into is None else retention.new_backup_path(into)
    _check_new_output(output)
    target = _target(args)
    _checked_brokers(args, target)
    _check_topic_exists(target)
    with job_session(args.master, "delayq-pipeline-backup") as spark:
        _use_store(spark, args, output, "--output", ())
        summary = backup(spark, target, output)
    result = {**summary.as_dict(), "output": output}
    if into is not None:
        result["deleted"] = retention.prune(into, args.keep)
    _emit(summary.line(), result)
    return 0


def run_restore(args: argparse.Namespace) -> int:
    """With --replay, under the topic's delivery pause (pipeline/restore_pause.py): taken
    before Spark starts, so consumers read it during the JVM's start."""
    from delayq.pipeline.backup import ITEMS, MANIFEST, replay, restore
    from delayq.pipeline.ingest import stderr_report
    from delayq.pipeline.restore_pause import paused_delivery
    from delayq.pipeline.spark import job_session

    _check_backup(args.input)
    target = _target(args)
    _checked_brokers(args, target)
    if args.replay is None:
        with job_session(args.master, "delayq-pipeline-restore") as spark:
            _use_store(spark, args, args.input, "--input", (ITEMS, MANIFEST))
            summary = restore(spark, args.input, target, args.shift)
        _emit(summary.line(), summary.as_dict())
        return 0
    _check_input(args.replay)
    with (
        paused_delivery(target, stderr_report) as pause,
        job_session(args.master, "delayq-pipeline-restore") as spark,
    ):
        _use_store(spark, args, args.input, "--input", (ITEMS, MANIFEST))
        pause.before_writing()
        summary = restore(spark, args.input, target, args.shift)
        replayed = replay(spark, args.replay, args.input, target, args.shift)
    report = {**summary.as_dict(), "replay": replayed.as_dict(), "pause": pause.as_dict()}
    _emit(f"{summary.line()}\n{replayed.line()}\n{pause.line()}", report)
    return 0


def run_audit(args: argparse.Namespace) -> int:
    from delayq.pipeline.audit_job import run
    from delayq.pipeline.spark import job_session

    _check_input(args.input)
    with job_session(args.master, "delayq-pipeline-audit") as spark:
        report = run(spark, args.input, args.output, args.grace_ms)
    _emit(f"audit: wrote {args.output}/audit.json and audit.html", report)
    return 0
