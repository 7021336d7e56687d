"""Renamed keywords keep their old name for one release (queue/renamed.py): the lease length
is `ack_timeout_ms` in every public name, as the topic's `ackTimeout`; `lease_ms` still works,
with a warning."""

from __future__ import annotations

import inspect
import warnings

import pytest

from delayq.queue import ConsumerSettings, Queue
from delayq.queue.renamed import renamed_kwargs

HOUR_MS = 3_600_000


def test_the_old_keyword_is_accepted_with_a_warning_at_the_callers_line() -> None:
    with pytest.warns(DeprecationWarning, match="lease_ms is renamed ack_timeout_ms") as caught:
        settings = ConsumerSettings(lease_ms=5_000)  # type: ignore[call-arg]
    assert settings.ack_timeout_ms == 5_000
    assert caught[0].filename == __file__  # points at the call to change, not at the library
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ConsumerSettings(ack_timeout_ms=5_000) == settings  # the new name: no warning
        assert ConsumerSettings(100, 200, 300).ack_timeout_ms == 300  # positions unchanged


def test_the_in_flight_cap_is_worker_concurrency_as_in_the_crd() -> None:
    with pytest.warns(DeprecationWarning, match="max_in_flight is renamed worker_concurrency"):
        settings = ConsumerSettings(max_in_flight=70)  # type: ignore[call-arg]
    assert settings.worker_concurrency == 70


def test_both_names_at_once_are_refused() -> None:
    with pytest.raises(TypeError, match="lease_ms is the old name of ack_timeout_ms"):
        ConsumerSettings(lease_ms=1, ack_timeout_ms=2)  # type: ignore[call-arg]


async def test_an_async_method_keeps_being_a_coroutine_function() -> None:
    @renamed_kwargs(old="new")
    async def call(*, new: int) -> int:
        return new

    assert inspect.iscoroutinefunction(call)
    with pytest.warns(DeprecationWarning, match="old is renamed new") as caught:
        assert await call(old=7) == 7  # type: ignore[call-arg]
    assert caught[0].filename == __file__


def test_a_claim_under_the_old_keyword_gets_the_lease_it_asked_for(queue: Queue) -> None:
    slot = queue.topic.slot_of("a")
    epoch = queue.take_over(slot)
    queue.schedule("a", delay_ms=0)
    with pytest.warns(DeprecationWarning, match="ack_timeout_ms"):
        batch = queue.claim(slot, epoch, lease_ms=HOUR_MS)  # type: ignore[call-arg]
    [stats] = queue.stats([slot]).slots
    assert stats.next_deadline_ms is not None
    assert stats.next_deadline_ms - batch.now_ms == pytest.approx(HOUR_MS, abs=1)  # not 30 s
