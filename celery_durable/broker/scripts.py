"""Loads the Lua scripts from ``lua/`` once per Redis client.

Each script file opens with a header naming its KEYS and ARGV, and has its
row in ``ops.py``; ``_prelude.lua`` is prepended to every script, after the
line that tells its fence rule whether the row is fenced, so the fencing
check exists in one place and runs in the same script as the write it guards.

Of the prelude, a script carries the functions it names and those they name
in turn, in the prelude's order, with its constants and the fence rule: Redis
runs a script's every top-level line on every call, and the whole prelude
(66 functions made afresh, then left to the GC) cost each call about 9 us,
against about 2 for the script's own work of a small one (issue 42).
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

from celery_durable.broker.ops import FENCED, SCRIPT_NAMES, WAKING_SCRIPTS

__all__ = ["SCRIPT_NAMES", "WAKING_SCRIPTS", "Clock", "Scripts", "now_ms", "script_source"]

LUA = resources.files("celery_durable.broker") / "lua"


@cache
def script_source(name: str) -> str:
    body = (LUA / f"{name}.lua").read_text(encoding="utf-8")
    fenced = name in FENCED
    return f"local FENCED = {'true' if fenced else 'false'}\n{_prelude_for(body, fenced)}\n{body}"


@cache
def _prelude_parts() -> tuple[tuple[str | None, str], ...]:
    """The prelude in order: each ``local function`` with the comment above
    it (named), and every other top-level statement (None: always kept)."""
    parts: list[tuple[str | None, str]] = []
    pending: list[str] = []
    current: str | None = None
    block: list[str] = []
    for line in (LUA / "_prelude.lua").read_text(encoding="utf-8").splitlines():
        if current is not None:
            block.append(line)
            if line == "end":
                parts.append((current, "\n".join(block)))
                current, block = None, []
            continue
        found = re.match(r"local function (\w+)\(", line)
        if found:
            current, block, pending = found.group(1), [*pending, line], []
        elif line.startswith("--") or not line.strip():
            pending.append(line)
        else:  # a constant, or the fence rule (from "if FENCED then" to its "end")
            parts.append((None, "\n".join([*pending, line])))
            pending = []
    if current is not None:
        raise RuntimeError(f"_prelude.lua: function {current} has no closing 'end' at the start of a line")
    return tuple(parts)


def _names_in(lua: str) -> set[str]:
    """The words of ``lua``'s code, its whole-line comments left out (they
    name functions they do not call)."""
    return set(re.findall(r"\w+", "\n".join(line for line in lua.splitlines() if not line.lstrip().startswith("--"))))


def _prelude_for(body: str, fenced: bool) -> str:
    """The prelude's functions ``body`` needs, with everything they need."""
    parts = _prelude_parts()
    named = {name: text for name, text in parts if name is not None}
    wanted = (_names_in(body) | ({"fence"} if fenced else set())) & named.keys()
    todo = list(wanted)
    while todo:
        for used in _names_in(named[todo.pop()]) & named.keys() - wanted:
            wanted.add(used)
            todo.append(used)
    return "\n".join(text for name, text in parts if name is None or name in wanted)


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
