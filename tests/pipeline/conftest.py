"""One local SparkSession for all pipeline tests: starting the JVM is the expensive part."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from delayq.pipeline.spark import session


@pytest.fixture(scope="package")
def spark() -> Iterator[Any]:
    spark = session("local[2]", "delayq-pipeline-tests", shuffle_partitions=2)
    try:
        yield spark
    finally:
        spark.stop()
