"""The engine's public API is `delayq.queue`: every exported name resolves, and the value types
live with the model, not in the internal plans module (no re-export shims)."""

from __future__ import annotations

import inspect

import pytest
import redis

import delayq.queue
from delayq.coordination.routed_queue import RoutedQueue
from delayq.queue import (
    AsyncQueue,
    InvalidMessageError,
    Queue,
    ScheduleOptions,
    ScheduleRequest,
    Target,
    Topic,
    read_plans,
)
from delayq.queue import plans as plans_module

MOVED = ["Target", "Retry", "DeadBatchResult", "PartlyStoredError", "ScheduleFailure"]


def test_every_exported_name_resolves() -> None:
    missing = [name for name in delayq.queue.__all__ if not hasattr(delayq.queue, name)]
    assert missing == []
    assert len(set(delayq.queue.__all__)) == len(delayq.queue.__all__)


def test_value_types_and_noscript_helpers_left_plans() -> None:
    for name in MOVED:
        assert getattr(delayq.queue, name).__module__ == "delayq.queue.model"
    for helper in ("not_loaded", "merged", "raise_first_error"):
        assert helper not in vars(plans_module)


def test_target_routes_like_the_plans() -> None:
    topic = Topic("routing", slot_amount=64)
    for target in (Target("order-42"), Target("order-42", slot_basis="customer-7")):
        [call] = read_plans.get(topic, [target]).calls
        assert f"/{target.slot(topic)}}}" in call.keys[0]
    assert Target("x", slot_basis="customer-7").slot(topic) == topic.slot_of("customer-7")
    with pytest.raises(InvalidMessageError, match="slot_basis"):
        Target("x", slot_basis="").slot(topic)


def test_schedule_options_are_the_requests_fields_and_the_mode() -> None:
    """`schedule`'s options are declared once (ScheduleOptions) for the three clients; its keys
    must stay the ScheduleRequest fields they fill, or an option would be typed but refused."""
    request_fields = set(ScheduleRequest._fields) - {"id", "payload"}
    assert set(ScheduleOptions.__annotations__) == request_fields | {"mode"}
    for client in (Queue, AsyncQueue, RoutedQueue):
        options = inspect.signature(client.schedule).parameters["options"]
        assert options.annotation == "Unpack[ScheduleOptions]", client


def test_an_unknown_schedule_option_is_refused_before_redis() -> None:
    queue = Queue(redis.Redis(port=1), Topic("options"))  # nothing listens: never reached
    with pytest.raises(TypeError, match="delay"):
        queue.schedule("a", delay=5)  # type: ignore[call-arg]
