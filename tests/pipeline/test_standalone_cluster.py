"""`spark-submit --master spark://…` on a real standalone cluster: a master and a worker process
started from the pyspark distribution, the jobs submitted through examples/pipeline/submit.py.

Proves the master comes from spark-submit (the job's executors run on the worker, not in a
local[2] driver), and that ingest -> archive -> audit round-trips through the cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from delayq.cli import main
from delayq.queue.client import Queue
from delayq.queue.topic import Topic

ROOT = Path(__file__).resolve().parents[2]
SUBMIT = ROOT / "examples" / "pipeline" / "submit.py"
SLOTS = 4
MESSAGES = 200

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _environment() -> dict[str, str]:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    env.pop("SPARK_CONF_DIR", None)
    return env


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as answer:
            state: dict[str, Any] = json.load(answer)
    except OSError:
        return 0
    return sum(1 for worker in state.get("workers", []) if worker.get("state") == "ALIVE")


class Cluster:
    def __init__(self, master_url: str, work_dir: Path) -> None:
        self.master_url = master_url
        self.work_dir = work_dir

    def submit(self, *argv: str) -> subprocess.CompletedProcess[str]:
        command = [
            "spark-submit", "--master", self.master_url, "--conf", "spark.cores.max=1",
            "--conf", "spark.executor.cores=1", "--conf", "spark.executor.memory=512m",
            str(SUBMIT), *argv,
        ]  # fmt: skip
        return subprocess.run(
            command, env=_environment(), capture_output=True, text=True, timeout=600, check=False
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if shutil.which("spark-class") is None or shutil.which("spark-submit") is None:
        pytest.skip("pyspark's spark-class / spark-submit are not on PATH")
    base = tmp_path_factory.mktemp("spark-standalone")
    port, ui_port, worker_ui_port = _free_port(), _free_port(), _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    env = _environment()
    logs = [(base / "master.log").open("w"), (base / "worker.log").open("w")]
    master = [
        "spark-class", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
        "--port", str(port), "--webui-port", str(ui_port),
    ]  # fmt: skip
    worker = [
        "spark-class", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
        "--cores", "1", "--memory", "1g", "--webui-port", str(worker_ui_port),
        "--work-dir", str(base / "work"), master_url,
    ]  # fmt: skip
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for command, log in zip((master, worker), logs, strict=True):
            processes.append(
                subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            )
        deadline = time.monotonic() + 180
        while _alive_workers(ui_port) < 1:
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                text = "\n".join(path.read_text()[-2000:] for path in base.glob("*.log"))
                pytest.fail(f"the standalone cluster did not come up:\n{text}")
            time.sleep(1)
        yield Cluster(master_url, base / "work")
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in logs:
            log.close()


def _summary(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-4000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_ingest_and_audit_run_on_the_standalone_cluster(
    cluster, redis_server, redis_client, tmp_path
):
    source = tmp_path / "orders.json"
    source.write_text(
        "".join(json.dumps({"id": f"o{i}", "delay": 3_600_000}) + "\n" for i in range(MESSAGES))
    )
    topic = ["--namespace", "shop", "--topic", "orders", "--slots", str(SLOTS)]
    ingest = cluster.submit(
        *["pipeline", "ingest", "--redis", redis_server.url, *topic, "--journal-max-len", "1000"],
        *["--input", str(source), "--format", "json", "--rejects", str(tmp_path / "rejects")],
    )
    summary = _summary(ingest)
    assert summary["read"] == MESSAGES
    assert summary["scheduled"] == MESSAGES
    queue = Queue.from_url(redis_server.url, Topic("orders", namespace="shop", slot_amount=SLOTS))
    assert queue.get("o7").payload == b""
    # The executors ran on the worker: spark-submit's master was used, not a local one.
    assert list(cluster.work_dir.glob("app-*/*/stderr")), "no executor ran on the worker"
    applications = {path.parent.parent.name for path in cluster.work_dir.glob("app-*/*/stderr")}

    journal, checkpoint = tmp_path / "journal", tmp_path / "checkpoints"
    archive = ["pipeline", "archive", "--redis", redis_server.url, *topic]
    assert main([*archive, "--output", str(journal), "--checkpoint", str(checkpoint)]) == 0

    output = tmp_path / "audit"
    audit = cluster.submit("pipeline", "audit", "--input", str(journal), "--output", str(output))
    _summary(audit)
    (audited,) = json.loads((output / "audit.json").read_text())["topics"]
    assert (audited["namespace"], audited["topic"]) == ("shop", "orders")
    assert audited["total"]["scheduled"] == MESSAGES
    assert audited["total"]["lost"] == 0  # due in an hour: waiting, not lost
    later = {path.parent.parent.name for path in cluster.work_dir.glob("app-*/*/stderr")}
    assert len(later - applications) == 1, "the audit's executors did not run on the worker"
