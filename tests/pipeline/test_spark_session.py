"""Who picks the Spark master and settings: `--master`, else spark-submit / spark-defaults.conf,
else `local[2]`; local tuning only fills gaps, never overrides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from delayq.pipeline.spark import FALLBACK_MASTER, REQUIRED_CONFIG, settings

SUBMITTED = {"spark.master": "k8s://https://kubernetes.default.svc", "spark.app.name": "nightly"}


def test_no_master_anywhere_falls_back_to_local_with_local_defaults():
    chosen = settings(None, {}, app_name="delayq-pipeline-ingest")
    assert chosen["spark.master"] == FALLBACK_MASTER == "local[2]"
    assert chosen["spark.ui.enabled"] == "false"
    assert chosen["spark.sql.shuffle.partitions"] == "8"
    assert chosen["spark.app.name"] == "delayq-pipeline-ingest"
    assert REQUIRED_CONFIG.items() <= chosen.items()


def test_a_configured_master_is_left_alone_and_so_is_the_cluster_tuning():
    chosen = settings(None, SUBMITTED, app_name="delayq-pipeline-ingest")
    assert "spark.master" not in chosen
    assert "spark.ui.enabled" not in chosen
    assert "spark.sql.shuffle.partitions" not in chosen
    assert "spark.app.name" not in chosen  # spark-submit --name wins
    assert REQUIRED_CONFIG.items() <= chosen.items()


def test_the_flag_wins_over_the_configuration():
    chosen = settings("spark://spark-master:7077", SUBMITTED)
    assert chosen["spark.master"] == "spark://spark-master:7077"
    assert "spark.ui.enabled" not in chosen


def test_local_defaults_fill_only_what_is_not_configured():
    configured = {
        "spark.master": "local[*]",  # spark-submit's own default
        "spark.app.name": "pyspark-shell",  # the name pyspark's own launcher gives
        "spark.sql.shuffle.partitions": "64",
    }
    chosen = settings(None, configured, app_name="delayq-pipeline-audit")
    assert "spark.master" not in chosen
    assert "spark.sql.shuffle.partitions" not in chosen
    assert chosen["spark.ui.enabled"] == "false"
    assert chosen["spark.app.name"] == "delayq-pipeline-audit"


def test_an_explicit_shuffle_partition_count_is_set():
    assert settings(None, SUBMITTED, shuffle_partitions=2)["spark.sql.shuffle.partitions"] == "2"


def test_an_empty_master_flag_means_not_given():
    assert "spark.master" not in settings("", SUBMITTED)


PROBE = textwrap.dedent(
    """
    import json, sys
    from delayq.pipeline.spark import job_session

    with job_session(sys.argv[1] or None, "delayq-probe") as spark:
        conf = spark.sparkContext.getConf()
        print(json.dumps({
            "master": spark.sparkContext.master,
            "shuffle": spark.conf.get("spark.sql.shuffle.partitions"),
            "ui": conf.get("spark.ui.enabled", "unset"),
            "tz": spark.conf.get("spark.sql.session.timeZone"),
        }))
    """
)


@pytest.mark.slow
def test_spark_defaults_conf_is_respected_and_the_flag_overrides_it(tmp_path):
    """A real JVM started the way pyspark starts it (through spark-submit), reading a
    spark-defaults.conf from SPARK_CONF_DIR: its master and tuning survive; --master wins."""
    (tmp_path / "spark-defaults.conf").write_text(
        "spark.master local[1]\nspark.sql.shuffle.partitions 3\nspark.ui.enabled true\n"
    )
    env = {**os.environ, "SPARK_CONF_DIR": str(tmp_path)}
    env.pop("PYSPARK_SUBMIT_ARGS", None)

    def probe(master: str) -> dict[str, str]:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, master],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=True,
        )
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    assert probe("") == {"master": "local[1]", "shuffle": "3", "ui": "true", "tz": "UTC"}
    flagged = probe("local[2]")
    assert flagged["master"] == "local[2]"
    assert flagged["shuffle"] == "3"


def test_a_job_run_in_another_thread_leaves_the_callers_session_running(spark):
    """A command run in a worker thread (as an async caller does with `asyncio.to_thread`) reuses
    the process's session and must not stop it: a thread sees no active session of its own,
    and the job used to take that for "none running" and stop the shared one at its end."""
    from concurrent.futures import ThreadPoolExecutor

    from delayq.pipeline.spark import job_session

    def job() -> int:
        with job_session(None, "delayq-threaded-job") as session:
            return int(session.range(3).count())

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(job).result() == 3
    assert spark.range(2).count() == 2  # still running
