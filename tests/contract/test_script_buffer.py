"""The prelude's buffer of a script's run hash and journal (``_prelude.lua``,
issue 42): what a script writes reaches Redis when it returns, what it reads
back within itself is what it wrote, and the buffered commands answer as
Redis would where a script may use the answer."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
import redis

from celery_durable.broker import ops
from celery_durable.broker.schema.run import RUN_FIELDS
from celery_durable.broker.scripts import LUA, script_source
from celery_durable.local.redis_server import RedisServer

PRELUDE = (LUA / "_prelude.lua").read_text(encoding="utf-8")


def _assembled(body: str) -> str:
    """``body`` as the loader assembles a script whose KEYS[1] is a run hash
    and KEYS[2] a journal (``scripts.script_source``)."""
    source = script_source("record_op")  # a row with both: the assembly itself is what is tested
    head, _, _ = source.partition("local function script_body()\n")
    head = re.sub(r"BUFFERED_RUN, BUFFERED_JOURNAL = \S+, \S+", "BUFFERED_RUN, BUFFERED_JOURNAL = 1, 2", head)
    head = head.replace("local FENCED = true", "local FENCED = false")
    return f"{head}local function script_body()\n{body}\nend\nreturn finish_script(script_body())\n"


RUN, JOURNAL = f"buffer{{{uuid.uuid4().hex}}}:run", f"buffer{{{uuid.uuid4().hex}}}:journal"


@pytest.fixture
def raw(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.delete(RUN, JOURNAL)
    client.close()


def _run(raw: redis.Redis, body: str) -> object:
    raw.delete(RUN, JOURNAL)
    raw.hset(RUN, mapping={"status": "running", "steps_done": "4", "args": "{}"})
    raw.hset(JOURNAL, mapping={"o:m:0": "1:s|a", "n:m": "1"})
    return raw.eval(_assembled(body), 2, RUN, JOURNAL)


def test_writes_reach_redis_when_the_script_returns_and_reads_see_them_before(raw: redis.Redis) -> None:
    reply = _run(
        raw,
        """
        redis.call('HSET', KEYS[1], 'status', 'completed', 'phase', 'Done')
        local n = redis.call('HINCRBY', KEYS[1], 'steps_done', 1)
        redis.call('HDEL', KEYS[1], 'args')
        redis.call('HSET', KEYS[2], 'o:m:1', '1:s|b', 'n:m', 2)
        redis.call('HDEL', KEYS[2], 'o:m:0')
        local f = redis.call('HMGET', KEYS[1], 'status', 'args', 'phase')
        return {n, f[1], tostring(f[2]), f[3], redis.call('HGET', KEYS[2], 'n:m'),
          redis.call('HEXISTS', KEYS[2], 'o:m:0')}
        """,
    )
    assert reply == [5, "completed", "false", "Done", "2", 0]
    assert raw.hgetall(RUN) == {"status": "completed", "steps_done": "5", "phase": "Done"}
    assert raw.hgetall(JOURNAL) == {"o:m:1": "1:s|b", "n:m": "2"}


def test_another_command_on_a_buffered_key_sees_the_writes_before_it(raw: redis.Redis) -> None:
    reply = _run(
        raw,
        """
        redis.call('HSET', KEYS[1], 'extra', 'x')
        local len = redis.call('HLEN', KEYS[1])
        redis.call('TIME')  -- a command with no key passes through as it is
        redis.call('DEL', KEYS[2])
        return {len, tostring(redis.call('HGET', KEYS[2], 'n:m'))}
        """,
    )
    assert reply == [4, "false"]
    assert not raw.exists(JOURNAL)


def test_counts_answer_as_redis_does_for_fields_the_script_knows(raw: redis.Redis) -> None:
    reply = _run(
        raw,
        """
        local known = redis.call('HSET', KEYS[1], 'status', 'paused', 'cancel', '1')
        local nx = redis.call('HSETNX', KEYS[1], 'cancel', '0')
        local gone = redis.call('HDEL', KEYS[1], 'cancel', 'pause')
        return {known, nx, gone}
        """,
    )
    # 'cancel' was new (the run hash's first read takes it), 'status' was not.
    assert reply == [1, 0, 1]


def test_numbers_are_written_as_redis_writes_them(raw: redis.Redis) -> None:
    _run(raw, "redis.call('HSET', KEYS[1], 'lock_until', 1733000000123, 'credits_nano', 2.5)")
    assert raw.hmget(RUN, "lock_until", "credits_nano") == ["1733000000123", "2.5"]


def test_the_run_hash_read_at_once_is_the_run_hash_less_its_big_values() -> None:
    listed = re.search(r"local RUN_FIELDS = \{(.*?)\}", PRELUDE, re.S)
    assert listed is not None
    named = set(re.findall(r"'([^']+)'", listed.group(1)))
    assert named <= set(RUN_FIELDS), f"not run hash fields: {named - set(RUN_FIELDS)}"
    assert not named & {"args", "limits", "result", "error"}, "a big value would be read by every script"


def test_no_script_uses_the_count_of_a_buffered_write() -> None:
    """HSET and HDEL on a buffered key answer nil for a field the script has
    not read: a script must never branch on that answer."""
    uses = re.compile(r"(?:=|==|if|\()\s*redis\.call\('(?:HSET|HDEL)', (\w+(?:\[\d\])?)")
    for name, op in ops.OPS.items():
        named = [r for r in op.keys if r != "*" and not r.endswith("?")]
        buffered = {f"KEYS[{named.index(role) + 1}]" for role in ("run", "journal") if role in named}
        for key in uses.findall((LUA / f"{name}.lua").read_text(encoding="utf-8")):
            assert key not in buffered, f"{name}.lua uses the count of a buffered {key} write"
    for key in uses.findall(PRELUDE):
        assert key not in {"run_key", "journal_key"}, f"the prelude uses the count of a buffered {key} write"
