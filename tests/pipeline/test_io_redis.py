"""The ingest writer without Spark: columns in, the engine's requests out, written to Redis."""

from __future__ import annotations

import pyarrow as pa

from delayq.pipeline import transforms as T
from delayq.pipeline.io_redis import (
    PartitionResult,
    RedisTarget,
    Reject,
    partition_writer,
    requests_of,
    result_schema,
)
from delayq.queue.model import ScheduleRequest


def _batch(payload: pa.Array, headers: pa.Array) -> pa.RecordBatch:
    """Three rows of `transforms.GOOD_COLUMNS` typed as Spark's Arrow conversion sends them
    (headers as JSON text; an absent column as Arrow's null type)."""
    columns = {
        T.ID: pa.array(["a", "b", "c"]),
        T.PAYLOAD: payload,
        T.DUE_MS: pa.array([1_000, None, None], pa.int64()),
        T.DELAY_MS: pa.array([None, 5, 0], pa.int64()),
        T.SLOT_BASIS: pa.array([None, "tenant", None]),
        T.HEADERS: headers,
        T.SLOT: pa.array([0, 1, 0], pa.int32()),
        T.PRIORITY: pa.array([0, 3, 0], pa.int64()),
        T.GROUP: pa.array([None, "c:42", None]),
    }
    return pa.RecordBatch.from_pydict(columns)


def test_requests_of_reads_each_column_by_name():
    headers = pa.array(['{"k":"v","n":"1"}', None, "{}"])
    batch = _batch(pa.array(["p", None, ""]), headers)
    assert requests_of(batch) == [
        ScheduleRequest("a", "p", None, 1_000, None, {"k": "v", "n": "1"}),
        # an absent payload is empty
        ScheduleRequest("b", b"", 5, None, "tenant", None, priority=3, group="c:42"),
        ScheduleRequest("c", "", 0, None, None, {}),
    ]


def test_requests_of_keeps_binary_payloads_and_absent_columns():
    """An input without a payload or headers column sends Arrow's null type for them."""
    binary = _batch(pa.array([b"\x00\xff", b"x", None]), pa.nulls(3))
    assert [r.payload for r in requests_of(binary)] == [b"\x00\xff", b"x", b""]
    absent = _batch(pa.nulls(3), pa.nulls(3))
    assert [(r.payload, r.headers) for r in requests_of(absent)] == [(b"", None)] * 3


def test_a_partition_result_is_one_row_of_the_result_schema():
    result = PartitionResult(rows=3, scheduled=1, existing=1, already_done=0)
    result.rejects.append(Reject("x", "TOO_FAR", '{"id": "x"}'))
    batch = result.to_arrow()
    assert batch.schema == result_schema()
    assert batch.to_pylist() == [
        {
            "rows": 3,
            "scheduled": 1,
            "existing": 1,
            "already_done": 0,
            "rejects": [{"id": "x", "reason": "TOO_FAR", "source": '{"id": "x"}'}],
        }
    ]
    assert PartitionResult().to_arrow().to_pylist()[0]["rejects"] == []


def test_the_writer_rejects_what_the_engine_refuses_and_writes_the_rest(redis_server):
    """The safety net behind the Spark rules: a row the engine's validation refuses (here a
    control character in the id, which Spark rejects before) becomes a reject with the engine's
    reason, and the rest of its batch is still scheduled."""
    batch = _batch(pa.array(["p", None, ""]), pa.nulls(3))
    batch = batch.set_column(0, T.ID, pa.array(["a", "b\x01", "c"]))
    target = RedisTarget((redis_server.url,), "shop", "writer", 2, 1024)
    [out] = list(partition_writer(target)(iter([batch])))
    [result] = out.to_pylist()
    assert (result["rows"], result["scheduled"], result["existing"]) == (3, 2, 0)
    [reject] = result["rejects"]
    assert reject["id"] == "b\x01"
    assert "control character U+0001" in reject["reason"]
