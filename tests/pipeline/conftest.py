"""One local SparkSession for all pipeline tests: starting the JVM is the expensive part.

Its JVM carries the S3A jars (scripts/install-s3a-jars.sh, cached after the first run), given as
a user gives them to an embedded pyspark: `--jars` in PYSPARK_SUBMIT_ARGS, read when the JVM
starts; the s3a:// backup tests need them, the others do not notice."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.pipeline.spark import session

ROOT = Path(__file__).resolve().parents[2]


def s3a_jars() -> str:
    """The S3A jars, comma-separated (installed into ~/.cache/delayq-tools on first use)."""
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install-s3a-jars.sh")],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="package")
def spark() -> Iterator[Any]:
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS")
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {s3a_jars()} pyspark-shell"
    try:
        spark = session("local[2]", "delayq-pipeline-tests", shuffle_partitions=2)
    finally:
        if submit_args is None:
            del os.environ["PYSPARK_SUBMIT_ARGS"]
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = submit_args
    try:
        yield spark
    finally:
        spark.stop()
