"""The one place a SparkSession is built, so every job and test runs with the same settings."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DEFAULT_MASTER = "local[2]"

# UTC session time zone: ISO timestamps without an offset mean UTC, never the host's zone, so a
# job gives the same due times wherever it runs. Partition type inference off: a topic named
# "2024" must stay a string, and `date=` partitions are compared as text.
BASE_CONFIG = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


def session(
    master: str = DEFAULT_MASTER, app_name: str = "delayq-pipeline", shuffle_partitions: int = 8
) -> Any:
    """Get (or create) the SparkSession: `local[2]` by default, or `spark://`, `k8s://` ..."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in {
        **BASE_CONFIG,
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
    }.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


@contextmanager
def job_session(master: str, app_name: str) -> Iterator[Any]:
    """A session for one CLI job, stopped afterwards unless it was already running.

    Reusing a running session lets a caller (a notebook, the tests) run the commands in-process
    without its own session being stopped under it.
    """
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    spark = session(master, app_name)
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()
