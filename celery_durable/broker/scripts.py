"""Loads the Lua scripts from ``lua/`` once per Redis client.

Each script file opens with a header naming its KEYS and ARGV; ``_prelude.lua``
is prepended to every script so the fencing check exists in one place and
runs in the same script as the write it guards.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import cast

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script

SCRIPT_NAMES = (
    "activate",
    "agent_call",
    "agent_finish",
    "agent_start",
    "begin_op",
    "branch_start",
    "claim_dead_workers",
    "claim_due",
    "examine",
    "commit_begin",
    "cancel",
    "complete_begin",
    "complete_branch",
    "create_run",
    "discard_run",
    "dispatch",
    "finish",
    "halt",
    "heartbeat",
    "index_forget",
    "index_intent",
    "index_run",
    "index_sync",
    "mark_lost",
    "mark_sent",
    "note_code",
    "pause",
    "read_history",
    "read_progress",
    "read_sequence",
    "read_sequences",
    "received",
    "record_op",
    "requeue",
    "release",
    "release_idempotency",
    "resume",
    "sending",
    "task_end",
    "unsent",
    "wait",
    "signal",
    "call",
    "call_done",
    "child",
    "child_done",
    "compensable",
    "step_over",
    "wake_branches",
    "look",
    "looked",
    "throttle_acquire",
    "throttle_delete",
    "throttle_enter",
    "throttle_forget",
    "throttle_granted",
    "throttle_release",
    "throttle_set",
    "throttle_wait",
)


WAKE_COUNTERS = ("token_queued",)
"""The prelude's functions that count a message of a run in flight before it
is published: a script calling one (or a prelude function that does) counts a
wake, which its caller publishes after it."""


@cache
def counts_wakes(name: str) -> bool:
    """Whether script ``name`` may count a wake, read from the Lua itself, so
    that a new script is known for one without anybody listing it."""
    folder = resources.files("celery_durable.broker") / "lua"
    prelude = (folder / "_prelude.lua").read_text(encoding="utf-8")
    bodies: dict[str, str] = {}
    current = ""
    for line in prelude.splitlines():
        found = re.match(r"local function (\w+)", line)
        if found:
            current = found.group(1)
            bodies[current] = ""
        elif current:
            bodies[current] += line + "\n"
    counting = set(WAKE_COUNTERS)
    grew = True
    while grew:
        grew = False
        for function, body in bodies.items():
            if function not in counting and any(re.search(rf"\b{c}\(", body) for c in counting):
                counting.add(function)
                grew = True
    body = (folder / f"{name}.lua").read_text(encoding="utf-8")
    return any(re.search(rf"\b{c}\(", body) for c in counting)


WAKING_SCRIPTS = frozenset(name for name in SCRIPT_NAMES if counts_wakes(name))
"""The scripts that may count a wake (``counts_wakes``)."""


@cache
def script_source(name: str) -> str:
    folder = resources.files("celery_durable.broker") / "lua"
    prelude = (folder / "_prelude.lua").read_text(encoding="utf-8")
    body = (folder / f"{name}.lua").read_text(encoding="utf-8")
    return f"{prelude}\n{body}"


class Scripts:
    """The registered scripts of one client; redis-py caches them by SHA.

    On a Redis Cluster a script is sent to the node serving its keys' slot
    (redis-py refuses keys of several slots before sending; the node refuses
    a key of another slot that a script builds itself) and, on first use,
    loaded on every master.
    """

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        # redis-py types register_script for Redis alone; a Script only calls
        # evalsha and script_load, which RedisCluster routes by slot.
        registrar = cast(redis.Redis, client)
        self._scripts: dict[str, Script] = {
            name: registrar.register_script(script_source(name)) for name in SCRIPT_NAMES
        }

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]


Clock = Callable[[], int]
"""Milliseconds since the epoch."""


def now_ms() -> int:
    return int(time.time() * 1000)
