"""Loads the Lua scripts from ``lua/`` once per Redis client.

Each script file opens with a header naming its KEYS and ARGV, and has its
row in ``ops.py``; ``_prelude.lua`` is prepended to every script, after the
line that tells its fence rule whether the row is fenced, so the fencing
check exists in one place and runs in the same script as the write it guards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import cast

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script

from celery_durable.broker.ops import FENCED, SCRIPT_NAMES, WAKING_SCRIPTS

__all__ = ["SCRIPT_NAMES", "WAKING_SCRIPTS", "Clock", "Scripts", "now_ms", "script_source"]

LUA = resources.files("celery_durable.broker") / "lua"


@cache
def script_source(name: str) -> str:
    prelude = (LUA / "_prelude.lua").read_text(encoding="utf-8")
    body = (LUA / f"{name}.lua").read_text(encoding="utf-8")
    fenced = "true" if name in FENCED else "false"
    return f"local FENCED = {fenced}\n{prelude}\n{body}"


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
