"""One local SparkSession for all pipeline tests: starting the JVM is the expensive part.

Its JVM carries the S3A jars (scripts/install-s3a-jars.sh, cached after the first run), given as
a user gives them to an embedded pyspark: `--jars` in PYSPARK_SUBMIT_ARGS, read when the JVM
starts; the s3a:// backup tests need them, the others do not notice."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from delayq.pipeline.spark import session
from tests.tool_support import installed


@pytest.fixture(scope="package")
def spark() -> Iterator[Any]:
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS")
    jars = installed("install-s3a-jars")
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--jars {jars} pyspark-shell"
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
