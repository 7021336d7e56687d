"""Topic.redis_sync_replicas: an acknowledged write is on the replicas, on a real master + replica.

The proof is a failover: the master is killed with SIGKILL right after acknowledged writes and
the replica promoted; everything acknowledged is there. A write the replica could not confirm
(replica frozen with SIGSTOP) is answered with ReplicationTimeoutError, never with success: with
asynchronous replication the same write would have been answered as done and could be lost.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import redis

from delayq.local.redis_server import RedisServer
from delayq.local.waiting import wait_until
from delayq.queue.client import Queue
from delayq.queue.codes import Code, ReplicationTimeoutError
from delayq.queue.model import ScheduleRequest, State, Target
from delayq.queue.topic import Topic, TopicError

pytestmark = pytest.mark.timeout(60)

TOPIC = Topic("sync", slot_amount=4, redis_sync_replicas=1, redis_sync_timeout_ms=5000)
# the replica frozen: every acknowledged write times out, so keep the wait short
FROZEN = Topic("sync", slot_amount=4, redis_sync_replicas=1, redis_sync_timeout_ms=300)


def _in_sync_replicas(master: RedisServer) -> int:
    info = redis.Redis(port=master.port).info("replication")
    return sum(
        1
        for key, value in info.items()
        if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
    )


@pytest.fixture
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master and one replica of it, in sync."""
    with (
        RedisServer() as master,
        RedisServer(extra_config={"replicaof": f"127.0.0.1 {master.port}"}) as replica,
    ):
        wait_until(lambda: _in_sync_replicas(master) == 1, 20, "the replica in sync")
        yield master, replica


def _promote(replica: RedisServer) -> Queue:
    client = redis.Redis(port=replica.port)
    client.replicaof("NO", "ONE")
    return Queue(client, TOPIC)


def test_acknowledged_writes_survive_a_master_killed_right_after(
    pair: tuple[RedisServer, RedisServer],
) -> None:
    master, replica = pair
    queue = Queue.from_url(master.url, TOPIC)
    requests = [ScheduleRequest(f"m{i}", b"p", delay_ms=3_600_000) for i in range(300)]
    for start in range(0, len(requests), 100):
        queue.schedule_many(requests[start : start + 100])  # every batch acknowledged
    queue.cancel("m0")
    queue.reschedule("m1", delay_ms=7_200_000)
    master.crash()
    promoted = _promote(replica)
    infos = promoted.get_many([Target(r.id) for r in requests])
    assert [info.id for info in infos if info.state is State.ABSENT] == ["m0"]
    assert all(info.state is State.SCHEDULED for info in infos[1:])
    assert infos[1].due_ms is not None
    assert infos[2].due_ms is not None
    assert infos[1].due_ms > infos[2].due_ms  # the reschedule is there too


def test_a_write_the_replica_cannot_confirm_is_never_answered_as_done(
    pair: tuple[RedisServer, RedisServer],
) -> None:
    master, replica = pair
    Queue.from_url(master.url, TOPIC).schedule("before", b"p", delay_ms=3_600_000)
    queue = Queue.from_url(master.url, FROZEN)
    assert replica.process is not None
    os.kill(replica.process.pid, signal.SIGSTOP)  # replication stalls: no ack from the replica
    try:
        with pytest.raises(ReplicationTimeoutError) as caught:
            queue.schedule("frozen", b"p", delay_ms=3_600_000)
        assert (caught.value.wanted, caught.value.confirmed) == (1, 0)
        assert caught.value.result.code is Code.CREATED  # type: ignore[attr-defined]
        # the write happened on the master: a retry is safe and says so
        with pytest.raises(ReplicationTimeoutError) as again:
            queue.schedule("frozen", b"p", delay_ms=3_600_000)
        assert again.value.result.code is Code.EXISTS  # type: ignore[attr-defined]
        master.crash()
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    promoted = _promote(replica)
    assert promoted.get("before").state is State.SCHEDULED  # acknowledged: kept
    # "frozen" may or may not be there (it sat in the replica's socket buffer): it was never
    # answered as done, which is all the caller relied on


def test_reads_and_claims_never_wait(pair: tuple[RedisServer, RedisServer]) -> None:
    master, replica = pair
    Queue.from_url(master.url, TOPIC).schedule("due", b"p", delay_ms=0)
    queue = Queue.from_url(master.url, FROZEN)
    assert replica.process is not None
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        slot = TOPIC.slot_of("due")
        epoch = queue.take_over(slot)
        [message] = queue.claim(slot, epoch).messages  # no ReplicationTimeoutError
        assert queue.get("due").state is State.PREPARED
        with pytest.raises(ReplicationTimeoutError):
            queue.ack(message.lease)  # an acknowledged write waits
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)


def test_sync_replicas_is_bounded() -> None:
    with pytest.raises(TopicError, match="syncReplicas"):
        Topic("t", redis_sync_replicas=17)
    with pytest.raises(TopicError, match="syncTimeout"):
        Topic("t", redis_sync_replicas=1, redis_sync_timeout_ms=0)
