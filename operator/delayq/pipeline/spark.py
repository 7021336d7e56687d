"""The one place a SparkSession is built, so every job and test runs with the same settings.

Who picks the master, highest first: `--master` (the `master` argument); what Spark is already
configured with (`spark-submit --master`, `--conf spark.master=`, `spark-defaults.conf`,
`PYSPARK_SUBMIT_ARGS`, `MASTER`, or spark-submit's own default `local[*]`); and only when none of
them set one, `local[2]`. Tuning settings (shuffle partitions, the UI) are defaults for local
masters, applied only where the configuration has no value; the job never overrides a value that
`spark-submit` or `spark-defaults.conf` set. `settings` is that decision, pure and unit-tested.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

FALLBACK_MASTER = "local[2]"
DEFAULT_MASTER = FALLBACK_MASTER  # what tests and the benchmark pass explicitly

# Correctness, always set: UTC session time zone (ISO timestamps without an offset mean UTC,
# never the host's zone, so a job gives the same due times wherever it runs); partition type
# inference off (a topic named "2024" must stay a string, and `date=` partitions are compared as
# text); no console progress bar (the jobs print their own progress line on stderr, which the
# bar would garble; the embedded launcher switches it on as for a shell).
REQUIRED_CONFIG = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}

# Defaults for a local master only, and only where the configuration has no value: a small
# embedded job needs neither a web UI nor 200 shuffle partitions. On a cluster, Spark's (or the
# user's) settings apply.
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
}

BASE_CONFIG = {**REQUIRED_CONFIG, **LOCAL_DEFAULTS}  # the embedded job's settings, for reference


LAUNCHER_APP_NAME = "pyspark-shell"  # what the launcher pyspark starts itself names the app


def settings(
    master: str | None,
    configured: Mapping[str, str],
    shuffle_partitions: int | None = None,
    app_name: str | None = None,
) -> dict[str, str]:
    """What the session builder sets, given the requested master (None: not given) and what
    Spark is already configured with. A key absent from the answer is left to Spark.

    An explicitly requested master or shuffle partition count is set; the master falls back to
    `local[2]` only when nothing configures one; local defaults fill only absent keys; the app
    name is ours unless `spark-submit --name` (or a script name) gave one.
    """
    chosen: dict[str, str] = dict(REQUIRED_CONFIG)
    if app_name and configured.get("spark.app.name", LAUNCHER_APP_NAME) == LAUNCHER_APP_NAME:
        chosen["spark.app.name"] = app_name
    if master:
        chosen["spark.master"] = master
    elif not configured.get("spark.master"):
        chosen["spark.master"] = FALLBACK_MASTER
    effective = chosen.get("spark.master") or configured["spark.master"]
    if shuffle_partitions is not None:
        chosen["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    if effective.startswith("local"):
        for key, value in LOCAL_DEFAULTS.items():
            if key not in configured and key not in chosen:
                chosen[key] = value
    return chosen


def configured_settings() -> dict[str, str]:
    """The settings Spark already has: the running context's, or else the JVM's system
    properties, which the launcher (`spark-submit`, or the one pyspark starts) filled from its
    flags, `PYSPARK_SUBMIT_ARGS` and `spark-defaults.conf`. Starts the JVM if needed (the session
    would start it anyway)."""
    from pyspark import SparkConf, SparkContext

    active = SparkContext._active_spark_context
    if active is not None:
        return dict(active.getConf().getAll())
    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


def session(
    master: str | None = None,
    app_name: str = "delayq-pipeline",
    shuffle_partitions: int | None = None,
) -> Any:
    """Get (or create) the SparkSession; `master` None leaves the choice to the configuration."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    configured = configured_settings()
    for key, value in settings(master, configured, shuffle_partitions, app_name).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


@contextmanager
def job_session(master: str | None, app_name: str) -> Iterator[Any]:
    """A session for one CLI job, stopped afterwards unless it was already running.

    Reusing a running session lets a caller (a notebook, the tests) run the commands in-process
    without its own session being stopped under it, from any thread: `SparkSession.active()`
    falls back to the process's default session, where `getActiveSession()` sees only the
    calling thread's (a command run in a worker thread stopped its caller's session).
    """
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    try:
        existing: Any = SparkSession.active()
    except PySparkRuntimeError:  # no session in this process
        existing = None
    spark = session(master, app_name)
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()
