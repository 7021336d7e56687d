"""The byte cap on what one read brings into the process (`queue/reply_cap.py`), on a real
redis-server: the slot copy and the doubling read a tenant's keys in the operator with it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from delayq.queue import reply_cap
from delayq.queue.record_buckets import hash_pages
from delayq.queue.reply_cap import (
    EntryPermitBusy,
    ReplyTooLarge,
    capped,
    fitted,
    holding_entries,
)


def test_a_reply_past_the_cap_is_refused_and_the_client_goes_on(redis_client: redis.Redis):
    """The read fails once the bytes pass the cap, not after the whole reply; the cut
    connection is dropped and the next request gets a fresh one."""
    redis_client.set("big", b"x" * 3 * 1024 * 1024)
    redis_client.set("small", b"y" * 1000)
    client = capped(redis_client)
    assert capped(client) is client
    assert capped(redis_client) is client  # one twin per client
    with pytest.raises(ReplyTooLarge, match=f"passed {reply_cap.PAGE_MAX_BYTES} bytes"):
        client.get("big")
    assert client.get("small") == b"y" * 1000
    pipe = client.pipeline(transaction=False)
    for _ in range(3):
        pipe.get("small")
        pipe.get("big")
    with pytest.raises(ReplyTooLarge):  # a pipeline's replies count together
        pipe.execute()
    assert client.get("small") == b"y" * 1000


def test_fitted_halves_a_page_and_reads_one_large_entry_alone(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(reply_cap, "PAGE_MAX_BYTES", 64 * 1024)
    monkeypatch.setattr(reply_cap, "ENTRY_MAX_BYTES", 256 * 1024)
    redis_client.rpush("list", *([b"s" * 1000] * 10 + [b"L" * 200_000] + [b"s" * 1000] * 10))
    client = capped(redis_client)

    def page(at: int) -> tuple[list[Any], int]:
        return fitted(client, lambda n: client.lrange("list", at, at + n - 1), 2000, "list")

    first, used = page(0)
    assert (len(first), used) == (7, 7)  # 2000, 1000, ..., 15 held the large one
    assert page(10)[1] == 1  # the large one alone, under ENTRY_MAX_BYTES
    redis_client.rpush("list", b"H" * 300_000)
    with pytest.raises(ReplyTooLarge, match="list: one entry passes 262144 bytes"):
        page(21)
    assert fitted(redis_client, lambda n: n, 7, "uncapped") == (7, 7)  # no cap, no retry


def test_a_hash_answered_past_one_entrys_cap_is_read_by_name(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
):
    """HSCAN answers a whole bucket of a hash's table, and a small hash (a listpack) whole,
    whatever its COUNT: past a single entry's cap the rest is read by name, every field."""
    monkeypatch.setattr(reply_cap, "PAGE_MAX_BYTES", 1024)
    monkeypatch.setattr(reply_cap, "ENTRY_MAX_BYTES", 2048)
    fields: dict[Any, Any] = {f"f{i:03d}".encode(): b"v" * 60 for i in range(100)}
    redis_client.hset("h", mapping=fields)
    assert redis_client.object("encoding", "h") == b"listpack"
    client = capped(redis_client)
    pages = list(hash_pages(client, "h", 2000))
    assert {k: v for page in pages for k, v in page.items()} == fields
    assert max(len(page) for page in pages) < 20  # each under 1 KiB
    assert list(hash_pages(redis_client, "h", 2000)) == [fields]  # uncapped: one page


def test_a_copy_holds_the_entry_permit_until_it_ends(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
):
    """A large entry is written after it is read: the copy that read one keeps the process's
    one entry permit until it ends, so only one copy's large entries are in memory at once;
    another's large read waits, and past ENTRY_PERMIT_WAIT_S fails (retried by its pass)
    instead of stalling behind a slow broker."""
    monkeypatch.setattr(reply_cap, "PAGE_MAX_BYTES", 64 * 1024)
    monkeypatch.setattr(reply_cap, "ENTRY_PERMIT_WAIT_S", 0.2)
    redis_client.set("large", b"L" * 200_000)
    client = capped(redis_client)

    def read_large() -> Any:
        return fitted(client, lambda _: client.get("large"), 1, "large")[0]

    def elsewhere() -> BaseException | None:
        with ThreadPoolExecutor(1) as other:
            return other.submit(read_large).exception(timeout=10)

    with holding_entries():
        assert read_large() == b"L" * 200_000
        assert read_large() == b"L" * 200_000  # the same copy: it holds the permit already
        assert isinstance(elsewhere(), EntryPermitBusy)
    assert elsewhere() is None  # given back when the copy ended
    read_large()  # outside a copy: given back after the read
    assert elsewhere() is None
