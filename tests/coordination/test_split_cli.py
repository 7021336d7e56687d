"""`delayq routing split` and its guards: one splitter at a time and no slot move meanwhile,
a power of two only, every broker named, and bad input a one-line error."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from delayq.cli import main
from delayq.coordination.migration import MoveError, SlotMover
from delayq.coordination.splitting import SlotSplitter, SplitLocked
from delayq.queue import Queue
from delayq.queue.model import State

from .splits import SLOTS, Cluster, basis_in, broker_queue, doubled, fill, run_steps


def test_one_splitter_at_a_time_and_no_slot_move_meanwhile(cluster: Cluster):
    first = cluster.splitter()
    run_steps(first, 1)  # frozen
    second = cluster.splitter()
    for attempt in (lambda: second.split(2 * SLOTS), second.abort):
        with pytest.raises(SplitLocked, match=r"the split is being run by .*-\d+/"):
            attempt()
    assert second.locked()
    mover = SlotMover(cluster.splitter().zk, cluster.paths, cluster.queues)
    with pytest.raises(MoveError, match="the topic's slots are being doubled"):
        mover.move(0, 1)
    assert first.split(2 * SLOTS) is not None
    assert not second.locked()
    # a move under way refuses a doubling
    new_queues = [Queue(queue.redis, doubled(cluster.topic)) for queue in cluster.queues]
    mover = SlotMover(cluster.splitter().zk, cluster.paths, new_queues)
    mover.step(*mover.start(0, 1))  # frozen, the copy next
    with pytest.raises(MoveError, match=r"slots \[0\] are moving"):
        second.split(4 * SLOTS)
    mover.move(0, 1)
    mover.release(0)


@pytest.mark.parametrize(
    ("to_slots", "error"),
    [(6, "not 6"), (4, None), (2, "not 2"), (32768, "not 32768")],
)
def test_a_doubling_grows_to_a_power_of_two_only(
    cluster: Cluster, to_slots: int, error: str | None
):
    splitter = cluster.splitter()
    if error is None:
        assert splitter.split(to_slots) is None
        return
    with pytest.raises(MoveError, match=error):
        splitter.split(to_slots)
    assert splitter.state() is None


def test_two_doublings_in_one_call(cluster: Cluster):
    fill(cluster, count=20)
    done = cluster.splitter().split(4 * SLOTS)
    assert done is not None
    assert (done.to_amount, done.to_generation) == (4 * SLOTS, 2)
    routing = cluster.routing()
    assert (routing.slot_amount, routing.generation) == (4 * SLOTS, 2)
    quad = replace(cluster.topic, slot_amount=4 * SLOTS, slot_generation=2)
    for message_id, basis in cluster.basis.items():  # custom bases too, doubled twice
        slot = quad.slot_of(basis)
        queue = Queue(cluster.admins[routing.broker_of_slot[slot]], quad)
        assert queue.get(message_id, basis).state is not State.ABSENT, message_id



def test_the_cli_doubles_shows_and_refuses_bad_input_in_one_line(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
):
    fill(cluster, count=20)
    splitter = cluster.splitter()
    run_steps(splitter, 3)
    splitter.release()
    assert main(cluster.routing_argv("show")) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("4 slots (generation 0) over 2 brokers")
    assert "doubling 4 -> 8 slots (generation 1): next step copy, 3 of 4 slots copied" in shown
    assert main(cluster.routing_argv("split", "--to-slots", "4")) == 2
    err = capsys.readouterr().err
    assert err.startswith("delayq routing split: a doubling to 8 slots is under way: finish it")
    assert err.count("\n") == 1
    assert main(cluster.routing_argv("split", "--to-slots", "8")) == 0
    assert capsys.readouterr().out == "doubled to 8 slots (generation 1)\n"
    assert main(cluster.routing_argv("show", "--json")) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["routing"]["slotAmount"] == 8
    assert document["routing"]["generation"] == 1
    assert document["split"] is None
    assert main(cluster.routing_argv("split", "--to-slots", "8")) == 0
    assert capsys.readouterr().out == "the topic has 8 slots already\n"
    assert main(cluster.routing_argv("split", "--to-slots", "12")) == 2
    assert "not 12" in capsys.readouterr().err
    assert main(cluster.routing_argv("split", "--to-slots", "8", "--abort")) == 2
    assert capsys.readouterr().err == "delayq routing split: no doubling is under way\n"
    # a slot move after the doubling works at the new generation (the routing's, not --slot-amount)
    assert main(cluster.routing_argv("move-slot", "--slot", "7", "--to-broker", "0")) == 0
    assert capsys.readouterr().out == "slot 7: moved from broker 1 to broker 0\n"


def test_a_slot_move_refuses_to_start_while_a_splitter_holds_its_lock(cluster: Cluster):
    """The splitter takes `movers/split`, then looks for moves, then records `split`; a mover
    takes `movers/<slot>`, then looks for a doubling. A mover that looked only at `split`
    started in between (the splitter had found no move, then recorded its doubling): each
    must look at the other's lock, which both take before they look."""
    splitter = cluster.splitter()
    splitter.lock.acquire()  # as `start` does, before it reads the moves and records `split`
    try:
        mover = SlotMover(cluster.splitter().zk, cluster.paths, cluster.queues)
        with pytest.raises(MoveError, match="the topic's slots are being doubled"):
            mover.start(0, 1)
        assert mover.migrations() == []
        assert not mover.locked()  # the refused mover gave its slot's lock up
    finally:
        splitter.release()
    assert splitter.split(2 * SLOTS) is not None


def test_a_splitter_missing_a_broker_refuses_before_it_records_or_freezes(cluster: Cluster):
    """`delayq routing split` given the URL of broker 0 only, for a routing over 2 brokers:
    it recorded the doubling, froze broker 0's slots, then failed on an IndexError, leaving
    the topic's writes refused until a run with every URL; it refuses first now."""
    fill(cluster, count=8)
    splitter = SlotSplitter(cluster.splitter().zk, cluster.paths, cluster.queues[:1])
    with pytest.raises(MoveError, match="names broker 1, but 1 broker"):
        splitter.split(2 * SLOTS)
    assert splitter.state() is None
    assert not splitter.locked()
    for slot in range(SLOTS):  # nothing frozen: every slot takes writes
        broker_queue(cluster, slot).schedule(
            "after", b"p", delay_ms=0, slot_basis=basis_in(cluster.topic, slot)
        )
