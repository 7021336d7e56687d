"""The engine's public API is `delayq.queue`: every exported name resolves, and the value types
live with the model, not in the internal plans module (no re-export shims)."""

from __future__ import annotations

import pytest

import delayq.queue
from delayq.queue import InvalidMessageError, Target, Topic
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
        [call] = plans_module.get(topic, [target]).calls
        assert f"/{target.slot(topic)}}}" in call.keys[0]
    assert Target("x", slot_basis="customer-7").slot(topic) == topic.slot_of("customer-7")
    with pytest.raises(InvalidMessageError, match="slot_basis"):
        Target("x", slot_basis="").slot(topic)
