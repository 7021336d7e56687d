"""`delayq pipeline ingest` end to end: local Spark into a real redis-server."""

from __future__ import annotations

import json
import re
import time

import pytest

from delayq.cli import main
from delayq.pipeline import ingest as ingest_module
from delayq.pipeline.ingest import ingest
from delayq.pipeline.io_redis import TOO_FAR_REASON, RedisTarget
from delayq.queue.client import Queue
from delayq.queue.keys import Part, slot_keys
from delayq.queue.model import State
from delayq.queue.topic import MAX_DELAY_MS, Topic

SLOTS = 8
LIMIT = 16

CSV = """\
id,payload,due_at,delay,headers
m1,hello,,1000,
m2,world,2026-01-01T00:00:00Z,,
m3,x,,60000,"{""k"":""v""}"
m1,again,,1000,
,no-id,,5,
m5,p,,,
m6,p,2026-01-01T00:00:00Z,5,
m7,p,garbage,,
m8,this payload is longer than sixteen bytes,,5,
m9,p,,99999999999999999,
"""

EXPECTED_REJECTS = {
    None: "missing id",
    "m5": "neither due_at nor delay given",
    "m6": "both due_at and delay given",
    "m7": "unparseable due_at",
    "m8": f"payload of 41 bytes over the limit of {LIMIT} bytes",
    "m9": f"delay beyond the maximum of {MAX_DELAY_MS} ms",
}


def _args(redis_server, path, rejects, fmt="csv", extra=()):
    return [
        "pipeline", "ingest", "--redis", redis_server.url, "--namespace", "shop",
        "--topic", "orders", "--slots", str(SLOTS), "--max-payload-bytes", str(LIMIT),
        "--input", str(path), "--format", fmt, "--rejects", str(rejects), *extra,
    ]  # fmt: skip


def _stored(redis_client, topic):
    return sum(redis_client.zcard(slot_keys(topic, s).key(Part.STORE)) for s in topic.slots)


def _rejects(spark, path):
    return {r.id: r for r in spark.read.json(str(path)).collect()}


def test_ingest_mixed_csv_then_rerun_schedules_nothing_twice(
    spark, redis_server, redis_client, tmp_path, capsys
):
    path, rejects = tmp_path / "in.csv", tmp_path / "rejects"
    path.write_text(CSV)
    topic = Topic("orders", namespace="shop", slot_amount=SLOTS, max_payload_bytes=LIMIT)

    assert main(_args(redis_server, path, rejects)) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["read"], first["scheduled"], first["already_present"], first["rejected"]) == (
        10, 3, 1, 6,
    )  # fmt: skip
    assert _stored(redis_client, topic) == 3
    found = _rejects(spark, rejects)
    assert {k: r.reason for k, r in found.items()} == EXPECTED_REJECTS
    assert json.loads(found["m7"].source) == {"id": "m7", "payload": "p", "due_at": "garbage"}

    queue = Queue.from_url(redis_server.url, topic)
    info = queue.get("m3")
    assert (info.state, info.payload, info.headers) == (State.SCHEDULED, b"x", {"k": "v"})
    assert queue.get("m2").due_ms == 1_767_225_600_000
    queue.close()

    assert main(_args(redis_server, path, rejects)) == 0
    second = json.loads(capsys.readouterr().out)
    assert (second["scheduled"], second["already_present"], second["rejected"]) == (0, 4, 6)
    assert _stored(redis_client, topic) == 3
    assert len(_rejects(spark, rejects)) == 6


def test_a_rerun_after_delivery_finds_the_delivered_ids_already_done(
    spark, redis_server, redis_client, tmp_path, capsys
):
    """With the topic's outcomeRetention passed, an id delivered and acked since the first run
    is remembered: the re-run counts it as already done instead of delivering it again."""
    path, rejects = tmp_path / "in.csv", tmp_path / "rejects"
    path.write_text(CSV)
    hour = ["--outcome-retention-ms", "3600000"]
    assert main(_args(redis_server, path, rejects, extra=hour)) == 0
    assert json.loads(capsys.readouterr().out)["scheduled"] == 3
    topic = Topic("orders", namespace="shop", slot_amount=SLOTS, outcome_retention_ms=3_600_000)
    queue = Queue.from_url(redis_server.url, topic)
    slot = topic.slot_of("m2")  # due 2026-01-01: due now
    [message] = queue.claim(slot, queue.take_over(slot), 10, 60_000).messages
    queue.ack(message.lease)
    queue.close()

    assert main(_args(redis_server, path, rejects, extra=hour)) == 0
    second = json.loads(capsys.readouterr().out)
    assert (second["scheduled"], second["already_present"], second["already_done"]) == (0, 3, 1)
    assert _stored(redis_client, topic) == 2


def test_ingest_json_lines_with_mapping_and_nested_headers(
    spark, redis_server, redis_client, tmp_path, capsys
):
    path, rejects = tmp_path / "in.jsonl", tmp_path / "rejects"
    rows = [
        {
            "key": f"j{i}",
            "body": f"b{i}",
            "wait": 10_000,
            "tenant": "t1",
            "meta": {"n": str(i)},
            "urgency": i % 10,
        }
        for i in range(20)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    mapping = "id=key,payload=body,delay=wait,slot_basis=tenant,headers=meta,priority=urgency"
    extra = ["--map", mapping]
    assert main(_args(redis_server, path, rejects, "json", extra)) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["scheduled"], summary["rejected"]) == (20, 0)
    topic = Topic("orders", namespace="shop", slot_amount=SLOTS)
    store = slot_keys(topic, topic.slot_of("t1")).key(Part.STORE)
    assert redis_client.zcard(store) == 20  # every id routed by its slot basis
    got = Queue.from_url(redis_server.url, topic).get("j7", "t1")
    assert (got.headers, got.priority) == ({"n": "7"}, 7)


def test_ingest_reports_what_the_server_clock_refuses(spark, redis_server, redis_client, tmp_path):
    """A due time valid by the client's clock but too far by the server's is a reject too."""
    now_ms = int(time.time() * 1000)
    too_far = now_ms + MAX_DELAY_MS + 24 * 3600 * 1000
    source = spark.createDataFrame(
        [("near", None, 5000), ("far", too_far, None)], "id string, due_at long, delay long"
    )
    target = RedisTarget((redis_server.url,), "shop", "orders", SLOTS, LIMIT)
    rejects = tmp_path / "rejects"
    summary = ingest(spark, source, target, str(rejects), now_ms=now_ms + 7 * 24 * 3600 * 1000)
    assert (summary.read, summary.scheduled, summary.rejected) == (2, 1, 1)
    assert _rejects(spark, rejects)["far"].reason == TOO_FAR_REASON


@pytest.mark.parametrize("partitions", [1, 3])
def test_ingest_parquet_counts_add_up(
    spark, redis_server, redis_client, tmp_path, partitions, monkeypatch
):
    source = spark.range(500).selectExpr(
        "concat('p', id) as id", "id * 10 as delay", "cast(concat('b', id) as binary) as payload"
    )
    source.write.parquet(str(tmp_path / "in"))
    target = RedisTarget((redis_server.url,), "shop", "orders", SLOTS, LIMIT, journal_max_len=1000)
    data = spark.read.parquet(str(tmp_path / "in"))
    lines: list[str] = []
    monkeypatch.setattr(ingest_module, "PROGRESS_INTERVAL_S", 0.01)
    summary = ingest(
        spark, data, target, str(tmp_path / "rejects"), partitions=partitions, report=lines.append
    )
    assert lines  # a Spark job lasts far longer than 10 ms
    assert all(re.fullmatch(r"ingest: \d+ rows written in .* tasks \d+/\d+", x) for x in lines)
    assert (summary.read, summary.scheduled, summary.rejected) == (500, 500, 0)
    topic = target.to_topic()
    assert _stored(redis_client, topic) == 500
    assert Queue.from_url(redis_server.url, topic).get("p7").payload == b"b7"
    journaled = sum(redis_client.xlen(slot_keys(topic, s).key(Part.JOURNAL)) for s in topic.slots)
    assert journaled == 500  # ingested messages are journaled like any other


def test_ingest_configuration_errors_are_one_line(redis_server, tmp_path, capsys):
    path = tmp_path / "in.csv"
    path.write_text("key,delay\na,1\n")
    assert main(_args(redis_server, path, tmp_path / "rejects", extra=["--map", "x=y"])) == 2
    assert "bad mapping 'x=y'" in capsys.readouterr().err
    bad_slots = [*_args(redis_server, path, tmp_path / "rejects"), "--slots", "12"]
    assert main(bad_slots) == 2
    assert "power of two" in capsys.readouterr().err


def test_malformed_lines_are_rejected_whole_not_cut_short(
    spark, redis_server, redis_client, tmp_path
):
    """A CSV line with more fields than its header (an unquoted comma in the payload) was cut
    to the header's width by Spark's PERMISSIVE mode and scheduled with half its payload; a
    JSON line that does not parse was rejected as "missing id". Both are rejects naming why."""
    target = RedisTarget((redis_server.url,), "shop", "malformed", SLOTS, 1024)
    csv, lines = tmp_path / "in.csv", tmp_path / "in.json"
    csv.write_text('id,delay,payload\nc1,1000,"quoted, fine"\nc2,1000,hello, world\n')
    lines.write_text('{"id": "j1", "delay": 1000}\n{"id": "j2", "delay": 10\n')
    for path, fmt in ((csv, "csv"), (lines, "json")):
        rejects = tmp_path / f"rejects-{fmt}"
        source = ingest_module.read_input(spark, str(path), fmt)
        summary = ingest(spark, source, target, str(rejects))
        assert (summary.read, summary.scheduled, summary.rejected) == (2, 1, 1)
        [reject] = spark.read.schema(ingest_module.REJECTS_SCHEMA).json(str(rejects)).collect()
        assert reject.reason == {
            "csv": "more fields than the header line",
            "json": "not a JSON object",
        }[fmt]
    found = _rejects(spark, tmp_path / "rejects-csv")
    assert json.loads(found["c2"].source)["payload"] == "hello"
    queue = Queue.from_url(redis_server.url, target.to_topic())
    assert queue.get("c1").payload == b"quoted, fine"
    queue.close()


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [
        ("archive", "--page-size", "0"),  # redis-py's DataError, with a traceback
        ("archive", "--page-size", "-3"),
        ("ingest", "--partitions", "0"),  # Spark's repartition(0), after the JVM started
        ("audit", "--grace-ms", "-1"),  # counted ids due after the journal's end as lost
        ("audit", "--master", "foo"),  # a Java stack trace, then a Python one
        ("ingest", "--master", "local[x]"),
    ],
)
def test_a_bad_option_is_refused_before_anything_runs(command, flag, value, capsys):
    argv = {
        "archive": ["--redis", "redis://127.0.0.1:1/0", "--topic", "t", "--slots", "4",
                    "--output", "o", "--checkpoint", "c"],
        "ingest": ["--redis", "redis://127.0.0.1:1/0", "--topic", "t", "--slots", "4",
                   "--input", "i", "--format", "csv", "--rejects", "r"],
        "audit": ["--input", "i", "--output", "o"],
    }[command]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main(["pipeline", command, *argv, flag, value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert flag in err.strip().splitlines()[-1]


def test_a_rejects_directory_holding_other_files_is_refused_untouched(
    redis_server, tmp_path, capsys
):
    """Spark's overwrite mode deletes the rejects path before writing: a --rejects that holds
    anything but an earlier rejects output (or the input itself) is refused before Spark
    starts, and nothing in it is touched."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "journal.parquet").write_text("not mine to delete")
    path = data / "in.csv"
    path.write_text("id,delay\na,1\n")
    elsewhere = tmp_path / "in.csv"
    elsewhere.write_text("id,delay\na,1\n")
    for rejects, input_path, said in (
        (data, elsewhere, "holds other files ('in.csv', ...)"),
        (data, path, "holds the --input"),
        (data / "journal.parquet", elsewhere, "is a file"),
    ):
        assert main(_args(redis_server, input_path, rejects)) == 2
        [line] = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"delayq pipeline ingest: --rejects {rejects} {said}")
    assert sorted(p.name for p in data.iterdir()) == ["in.csv", "journal.parquet"]


def test_arrow_writer_keeps_types_rejects_and_reruns_idempotently(
    spark, redis_server, redis_client, tmp_path
):
    """Parquet with binary payloads, a map of headers and a slot basis, through the Arrow writer:
    the engine stores what the file holds; a row the engine would refuse (a control character in
    its id) lands in the rejects with its whole source row; a re-run schedules nothing twice and
    rejects the same row again."""
    bad_id = "bad\x01id"
    spark.createDataFrame(
        [
            ("m1", b"\x00\xff", 5000, "t1", {"k": "v"}),
            ("m2", None, 6000, None, None),
            (bad_id, b"x", 5000, None, None),
        ],
        "id string, payload binary, delay long, slot_basis string, headers map<string,string>",
    ).write.parquet(str(tmp_path / "in"))
    target = RedisTarget((redis_server.url,), "shop", "orders", SLOTS, LIMIT)
    topic, rejects = target.to_topic(), str(tmp_path / "rejects")

    def run():
        return ingest(spark, spark.read.parquet(str(tmp_path / "in")), target, rejects)

    first = run()
    assert (first.read, first.scheduled, first.already_present, first.rejected) == (3, 2, 0, 1)
    [reject] = _rejects(spark, rejects).values()
    assert reject.id == bad_id
    assert reject.reason == "id contains a control character"
    assert json.loads(reject.source) == {"id": bad_id, "payload": "eA==", "delay": 5000}
    queue = Queue.from_url(redis_server.url, topic)
    m1, m2 = queue.get("m1", "t1"), queue.get("m2")
    queue.close()
    assert (m1.payload, m1.headers, m2.payload, m2.headers) == (b"\x00\xff", {"k": "v"}, b"", {})

    second = run()
    assert (second.read, second.scheduled, second.already_present, second.rejected) == (3, 0, 2, 1)
    assert _stored(redis_client, topic) == 2
    assert [r.id for r in _rejects(spark, rejects).values()] == [bad_id]


def test_the_topics_published_quota_and_expiry_apply_with_no_flag(
    spark, redis_server, redis_client, tmp_path, capsys
):
    """The topic's owner published its settings record: the ingest, given none of them,
    obeys its quota (a reject) and its default expiry; its outcome retention likewise (the
    same schedule script, tests/queue/test_topic_record.py)."""
    ttl_ms = 400 * 24 * 3_600_000  # past 2026-01-01, the due time of a row below
    published = Topic(
        "orders",
        namespace="shop",
        slot_amount=SLOTS,
        limits_max_pending=SLOTS,  # one per slot
        expiry_ttl_ms=ttl_ms,
    )
    Queue(redis_client, published).publish_settings("uid-orders", 1)
    topic = Topic("orders", namespace="shop", slot_amount=SLOTS)  # what a client knows
    slot = topic.slot_of("a0")
    due, later = [i for i in (f"a{n}" for n in range(200)) if topic.slot_of(i) == slot][:2]
    path, rejects = tmp_path / "in.csv", tmp_path / "rejects"
    rows = f"{due},p,2026-01-01T00:00:00Z,,\n{later},p,,1000,\n"
    path.write_text("id,payload,due_at,delay,headers\n" + rows)
    assert main(_args(redis_server, path, rejects)) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["scheduled"], summary["rejected"]) == (1, 1)
    assert _rejects(spark, rejects)[later].reason == "OVER_QUOTA"
    info = Queue(redis_client, topic).get(due)
    assert info.due_ms is not None
    assert info.expire_at_ms == info.due_ms + ttl_ms
