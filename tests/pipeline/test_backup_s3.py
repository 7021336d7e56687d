"""`delayq pipeline backup | restore` against an S3-compatible store: a real MinIO server
(tests/pipeline/minio_server.py), real Spark with the S3A jars, real redis-server. A backup to
s3a:// restored into an empty topic brings every message back; a wrong credential is one line
naming the path, with no traceback and no secret in it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from pyarrow.fs import FileType

from delayq.cli import main
from delayq.local.redis_server import RedisServer
from delayq.pipeline.object_store import masked, s3a_settings
from delayq.queue.client import Queue
from delayq.queue.model import ScheduleRequest, State
from delayq.queue.topic import Topic
from tests.pipeline.minio_server import MinioServer

SOURCE = Topic("orders", namespace="shop", slot_amount=4)
TARGET = Topic("orders-restored", namespace="shop", slot_amount=2)
BUCKET = "backups"


@pytest.fixture(scope="module")
def minio() -> Iterator[MinioServer]:
    with MinioServer() as server:
        server.filesystem().create_dir(BUCKET)
        yield server


def _pipeline(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["pipeline", *argv, "--master", "local[2]"])
    out, err = capsys.readouterr()
    return code, out, err


def _topic_args(url: str, topic: Topic) -> list[str]:
    return [
        *["--redis", url, "--namespace", topic.namespace, "--topic", topic.name],
        *["--slots", str(topic.slot_amount)],
    ]


def test_a_backup_to_s3_restored_into_an_empty_topic_brings_every_message_back(
    spark: Any,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    minio: MinioServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source, target = Queue(redis_client, SOURCE), Queue(redis_client, TARGET)
    due_ms = int(redis_client.time()[0]) * 1000 + 3_600_000
    sent = {f"m{i}": (f"payload {i}".encode(), due_ms + i) for i in range(40)}
    source.schedule_many([ScheduleRequest(i, p, at_ms=at) for i, (p, at) in sent.items()])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", minio.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", minio.secret_key)
    path = f"s3a://{BUCKET}/shop/orders/1"

    code, out, err = _pipeline(
        capsys, "backup", *_topic_args(redis_server.url, SOURCE), "--output", path,
        "--s3-endpoint", minio.endpoint,
    )
    assert code == 0, err
    assert json.loads(out)["items"] == {"waiting": len(sent)}
    stored = minio.filesystem().get_file_info(f"{BUCKET}/shop/orders/1/items/_SUCCESS")
    assert stored.size == 0  # written through S3A, read back by another S3 client

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", minio.endpoint)  # the variable, not the flag
    again = ("backup", *_topic_args(redis_server.url, SOURCE), "--output", path)
    exists = f"--output {path} exists: give a new path for the backup"
    assert _pipeline(capsys, *again)[::2] == (2, f"delayq pipeline backup: {exists}\n")
    empty = ("restore", *_topic_args(redis_server.url, TARGET), "--input", f"{path}/items")
    absent = f"cannot read --input {path}/items: no backup there (no items/)"
    assert _pipeline(capsys, *empty)[::2] == (1, f"delayq pipeline restore: {absent}\n")
    code, out, err = _pipeline(
        capsys, "restore", *_topic_args(redis_server.url, TARGET), "--input", path
    )
    assert code == 0, err
    assert json.loads(out)["counts"] == {"waiting:CREATED": len(sent)}
    for message_id, (payload, at_ms) in sent.items():
        restored = target.get(message_id)
        assert (restored.state, restored.payload, restored.due_ms) == (
            State.SCHEDULED, payload, at_ms
        )


def test_a_wrong_credential_is_one_line_naming_the_path_without_the_secret(
    spark: Any,
    redis_server: RedisServer,
    redis_client: redis.Redis,
    minio: MinioServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    Queue(redis_client, SOURCE).schedule_many([ScheduleRequest("m", b"p", delay_ms=60_000)])
    wrong = "not-the-secret-" + minio.secret_key[::-1]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", minio.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    monkeypatch.setenv("AWS_ENDPOINT_URL", minio.endpoint)
    path = f"s3a://{BUCKET}/denied"  # the backup of the first test lies next to it

    for command, where in (("backup", "--output"), ("restore", "--input")):
        code, out, err = _pipeline(
            capsys, command, *_topic_args(redis_server.url, SOURCE), where, path
        )
        assert (code, out) == (1, "")
        assert err.startswith(f"delayq pipeline {command}: cannot use {where} {path}: "), err
        assert "403" in err
        assert len(err.strip().splitlines()) == 1, err
        assert wrong not in err
        assert minio.secret_key not in err
    assert minio.filesystem().get_file_info(f"{BUCKET}/denied").type == FileType.NotFound


def test_s3a_settings_come_from_the_standard_environment_and_the_flag_wins() -> None:
    environ = {
        "AWS_ACCESS_KEY_ID": "id",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_ENDPOINT_URL": "http://store:9000",
        "AWS_ENDPOINT_URL_S3": "http://s3-store:9000",
    }
    assert s3a_settings(None, environ) == {
        "fs.s3a.access.key": "id",
        "fs.s3a.secret.key": "secret",
        "fs.s3a.endpoint": "http://s3-store:9000",
        "fs.s3a.endpoint.region": "us-east-1",
        "fs.s3a.path.style.access": "true",
    }
    flagged = s3a_settings("http://flag:9000", {**environ, "AWS_REGION": "eu-west-1"})
    assert flagged["fs.s3a.endpoint"] == "http://flag:9000"
    assert flagged["fs.s3a.endpoint.region"] == "eu-west-1"
    assert s3a_settings(None, {}) == {}  # AWS itself, S3A's own credential chain


def test_a_secret_of_the_environment_is_masked_in_a_message() -> None:
    environ = {"AWS_SECRET_ACCESS_KEY": "s3cr3t", "AWS_SESSION_TOKEN": "t0ken"}
    assert masked("denied for s3cr3t and t0ken", environ) == "denied for *** and ***"
