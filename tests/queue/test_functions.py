"""The functions library is generated from whatever `lua/*.lua` files exist, versioned by its
source, with each file's flags; a real redis-server loads it and runs a generated function."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from delayq.local.redis_server import RedisServer
from delayq.queue import functions
from delayq.queue.scripts import Script, script_file

NEW_FILE = """#!lua flags=no-writes
--[[
  A transition added later (a merge): no change to the generator needed.

  KEYS[1] epoch  STRING fencing epoch

  ARGV: none

  Returns the epoch and a code.

  Events: none
]]
--@include codes
--@include now_ms

return {redis.call('GET', KEYS[1]) or false, CODE.OK, now_ms() > 0}
"""


def files() -> dict[str, str]:
    return {script.value: script_file(script) for script in Script}


@pytest.fixture
def admin(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    client.function_flush()
    try:
        yield client
    finally:
        client.function_flush()
        client.close()


def test_every_file_is_a_function_with_its_flags_and_the_name_carries_a_hash() -> None:
    library = functions.library()
    assert library == functions.build(files())
    for script in Script:
        flags, _ = functions.split_shebang(script_file(script))
        name = library.function(script)
        assert f"function_name = '{name}', flags = {{{', '.join(map(repr, flags))}}}" in (
            library.source
        ), script
        assert library.command(script) == ("FCALL_RO" if "no-writes" in flags else "FCALL")
    assert library.read_only == {"get", "stats", "deadpage", "schedules", "overview", "settings"}
    assert library.source.count("local function now_ms()") == 1  # helpers once, at the top


def test_a_changed_or_added_file_is_another_version() -> None:
    base = functions.build(files())
    changed = files()
    changed[Script.FENCE.value] += "\n-- changed\n"
    assert functions.build(changed).name != base.name
    added = {**files(), "probe-1": NEW_FILE}
    library = functions.build(added)
    assert library.name != base.name
    assert f"'{library.name}_probe'" in library.source
    assert "probe" in library.read_only


def test_a_generated_library_loads_and_its_functions_run(admin: redis.Redis) -> None:
    library = functions.build({**files(), "probe-1": NEW_FILE})
    admin.function_load(library.source)
    admin.set("epoch-key", "7")
    assert admin.fcall_ro(f"{library.name}_probe", 1, "epoch-key") == [b"7", 0, 1]
    assert admin.fcall_ro(library.version_function, 0) == library.name.encode()
    with pytest.raises(redis.ResponseError, match="write flag"):
        admin.fcall_ro(f"{library.name}_fence", 1, "x", "1")  # a writer is not FCALL_RO


async def test_a_broker_holding_more_functions_than_delayq_ever_loads_is_not_listed(
    admin: redis.Redis, redis_server: RedisServer
) -> None:
    """Regression: the operator lists a broker's delayq libraries on every health pass
    (FUNCTION LIST, every function's name and description), and the topic's tenant holds the
    brokers' admin login: a library of its own with descriptions of 24 MB was read whole into
    the operator each pass, as would be one of the broker's whole memory. Over the bound the
    list is refused (a Redis error, which the operator's deletion logs and retries), unread."""
    functions.load(admin)
    description = "x" * (12 * 1024 * 1024)
    admin.function_load(
        "#!lua name=delayq_0bad\n"
        + "".join(
            f"redis.register_function{{function_name='f{n}', callback=function() return 1 end, "
            f"description='{description}'}}\n"
            for n in range(2)
        )
    )
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        with pytest.raises(functions.FunctionsTooLargeError, match="used_memory_functions"):
            await functions.loaded_async(client)
        admin.function_delete("delayq_0bad")
        assert await functions.loaded_async(client) == [functions.library().name]
    finally:
        await client.aclose()
