"""The Redis ACL user a topic's delay services need, and nothing more (pure).

The engine knows which commands it sends and which keys it touches, so it owns the rules: the
Kubernetes builders and the tests only render them. A user created with `service_user_rules`
can run every engine operation of its topic (the functions of the engine's library, the
wake-up lists, the stats) but cannot run CONFIG, FLUSHALL, KEYS, CLIENT or any other command,
nor read or write a key of another topic, even from inside a function (Redis checks every
`redis.call` against the caller's ACL). It runs no code of its own: no EVAL, EVALSHA, SCRIPT,
FUNCTION (only FCALL and FCALL_RO of the library the operator loaded), RESTORE, DEBUG or MODULE.

The commands are the ones the client sends (`CLIENT_COMMANDS`) plus every command the Lua
scripts call (`SCRIPT_COMMANDS`); `tests/queue/test_acl.py` checks the latter against the
scripts' source, so a new `redis.call` cannot ship without its permission.
"""

from __future__ import annotations

from delayq.queue.keys import SETTINGS_PREFIX
from delayq.queue.topic import Topic

#: The Redis user of a topic's delay services (password: the topic Secret's `redis-password`).
SERVICE_USER = "delayq-service"
#: The Redis user of a stream topic's consumers, on the broker that holds the target stream
#: (password: the `<topic>-stream-reader` Secret's `password`, made by the operator).
STREAM_READER_USER = "delayq-stream-reader"
#: The Redis user of a topic's scheduled backups (spec.backup; password: the topic Secret's
#: `backup-password`): the topic's keys, reading only (backup_user_rules).
BACKUP_USER = "delayq-backup"
#: The Redis user of the operator and of replication (`redis-admin-password`): every command.
ADMIN_USER = "delayq-operator"
#: Its rules (add `>password`): every key, channel and command.
ADMIN_RULES = ("reset", "on", "~*", "&*", "+@all")

#: Sent by the Python client: the engine's functions (FCALL, FCALL_RO of the library an admin
#: loaded, `queue/functions.py`: no EVAL*, SCRIPT or FUNCTION, so no code of its own), the
#: consumer's blocking wake-up wait and its interrupts, the stream delivery's XADD, the server
#: clock, WAIT after an acknowledged write of a topic with `redis_sync_replicas`, health checks
#: and the RESP3 handshake, and the slot mover's copy (`queue/slot_copy.py`: ZRANGE, HSCAN, GET,
#: LRANGE, XRANGE page by page on the frozen source, then UNLINK and ZADD, HSET, SET, RPUSH,
#: XADD page by page on the target; run with the service's credentials from one of its pods, the
#: key patterns still hold it to the topic's own keys. No DUMP/RESTORE: a crafted RESTORE
#: payload is a known way into Redis's memory), and the slot splitter's (`queue/slot_split.py`:
#: ZSCAN, HSCAN, GET, ZSCORE, HGET, HMGET, HEXISTS, XRANGE on the old keys, then ZADD, HSET,
#: SET, ZREM, HDEL, XADD on the next generation's; SADD, SSCAN, SUNIONSTORE on the changes it
#: tracks). Both read
#: a hash by name (HKEYS, then HMGET) when one HSCAN answer passes a single entry's cap
#: (`record_buckets.hash_pages`). Not CLIENT SETINFO, which redis-py sends on connect and whose
#: refusal it ignores (and which Redis 7.0 does not know: naming it would fail the whole
#: SETUSER).
CLIENT_COMMANDS = (
    "fcall",
    "fcall_ro",
    "blpop",
    "rpush",
    "del",
    "xadd",
    "time",
    "wait",
    "ping",
    "hello",
    "unlink",
    "hscan",
    "hkeys",
    "hexists",
    "lrange",
    "xrange",
    "zscan",
    "sscan",
    "sunionstore",
    "multi",
    "exec",
)

#: Called from the Lua transitions (directly or through the chunked helpers).
SCRIPT_COMMANDS = (
    "exists",
    "sadd",
    "get",
    "mget",  # the epochs of a call's slots at once (schedulemany-1, claimmany-1)
    "set",
    "del",
    "incr",
    "lrange",  # a slot's wake list, the due it holds (lua/includes/wake_at.lua)
    "rpush",
    "hget",
    "hmget",
    "hset",
    "hdel",
    "hlen",
    "hgetall",
    "zadd",
    "zrem",
    "zcard",
    "zcount",
    "zrange",
    "zrangebyscore",
    "zrangebylex",  # the fair groups' indexes (lua/includes/due_by_group.lua)
    "zlexcount",
    "zscore",
    "zmscore",
    "xadd",
    "time",
    "pexpire",  # pace-1, hold-1: the topic's pace expires once nothing is left in it
    "pttl",
)


#: Called by the previous version's scripts, which run until the operator loads this one's
#: library: the wake-up's LLEN (now LRANGE, `lua/includes/wake_at.lua`). Kept in the service
#: user's rules so that an upgrade renders the same rules and restarts no broker for them.
PREVIOUS_SCRIPT_COMMANDS = ("llen",)


def key_patterns(topic: Topic, stream_key: str = "") -> list[str]:
    """Every key the topic's services may touch: its slots' keys (`dq:{<ns>/<topic>/<slot>}:*`),
    its consumers' control lists (`dq:{<ns>/<topic>}:*`) and, for a stream topic, the target
    stream. `{` and `}` are literal in ACL patterns."""
    prefix = f"dq:{{{topic.namespace}/{topic.name}"
    patterns = [f"{prefix}/*", f"{prefix}}}:*"]
    if stream_key:
        patterns.append(stream_key)
    return patterns


def settings_pattern(topic: Topic) -> str:
    """The slots' settings records of the topic (`SlotKeys.settings`, every key generation):
    its owner's, which its users' scripts read and may not write (`topic_record.py`)."""
    return f"{SETTINGS_PREFIX}:{{{topic.namespace}/{topic.name}/*"


def service_user_rules(topic: Topic, stream_key: str = "") -> list[str]:
    """`ACL SETUSER` rules of the topic's delay services, without the password (add
    `>password`): the key patterns, read-only the topic's settings records (Redis 7's `%R~`:
    no service, pipeline or producer can change the limits its scripts obey), no pub/sub
    channel and exactly the engine's commands. Starts from a reset, so applying them again
    replaces whatever the user had."""
    commands = sorted({*CLIENT_COMMANDS, *SCRIPT_COMMANDS, *PREVIOUS_SCRIPT_COMMANDS})
    return [
        "reset",
        "on",
        *(f"~{pattern}" for pattern in key_patterns(topic, stream_key)),
        f"%R~{settings_pattern(topic)}",
        "resetchannels",
        "-@all",
        *(f"+{command}" for command in commands),
    ]


#: What a consumer group reader of the target stream needs: read the entries (XREAD, XRANGE,
#: XLEN, XINFO), read through a group (XREADGROUP), acknowledge and take over pending entries
#: (XACK, XPENDING, XCLAIM, XAUTOCLAIM), make its group and its consumers (XGROUP CREATE with
#: MKSTREAM, CREATECONSUMER, DELCONSUMER) and the connection's handshake. No XADD, XDEL, XTRIM,
#: DEL or XGROUP DESTROY/SETID: it can neither add, remove nor rewind entries, and can never
#: drop another consumer group.
STREAM_READER_COMMANDS = (
    "xread",
    "xreadgroup",
    "xrange",
    "xrevrange",
    "xlen",
    "xinfo",
    "xack",
    "xpending",
    "xclaim",
    "xautoclaim",
    "xgroup|create",
    "xgroup|createconsumer",
    "xgroup|delconsumer",
    "ping",
    "hello",
)


def stream_reader_rules(stream_key: str) -> list[str]:
    """`ACL SETUSER` rules of a stream topic's reader, without the password (add `>password`):
    its target stream as the only key, no pub/sub channel, `STREAM_READER_COMMANDS` only. The
    key is taken as written (the spec parser refuses glob characters in it)."""
    return [
        "reset",
        "on",
        f"~{stream_key}",
        "resetchannels",
        "-@all",
        *(f"+{command}" for command in STREAM_READER_COMMANDS),
    ]


#: What `delayq pipeline backup` sends (`queue/backup.py` `snapshot`: ZRANGE, HGETALL, GET and
#: TIME in one MULTI per slot; the job's checks: PING, GET of the epochs, EXISTS of the topic's
#: keys), none of them a write. The service user has each (tests/queue/test_acl.py), so the
#: pipeline backs up with the rights it has; a user of exactly these can back up and can write
#: nothing.
BACKUP_COMMANDS = ("multi", "exec", "zrange", "hgetall", "get", "exists", "time", "ping", "hello")


def backup_user_rules(topic: Topic) -> list[str]:
    """`ACL SETUSER` rules of a read-only backup user of the topic, without the password."""
    return [
        "reset",
        "on",
        *(f"~{pattern}" for pattern in key_patterns(topic)),
        "resetchannels",
        "-@all",
        *(f"+{command}" for command in BACKUP_COMMANDS),
    ]
