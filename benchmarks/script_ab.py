"""What one run costs Redis under two versions of the scripts, compared run by run.

A change to the Lua moves a typical run's Redis time by a few per cent, and
the shared machine's own drift between two measurements taken minutes apart
is larger than that (the same checkout measured 1,400 to 2,400 us a run in
one morning). So each version's run is recorded once, in its own checkout,
and the recordings are then sent again alternately, one run of each in
turn, each version to a private Redis of its own: whatever the machine does
meanwhile, both sides see it.

    # in each checkout (a git worktree each):
    PYTHONPATH=. python -m benchmarks.script_ab record /tmp/a.json [workflow]
    # then, from any one of them, twice with the order swapped:
    PYTHONPATH=. python -m benchmarks.script_ab compare 500 /tmp/a.json /tmp/b.json

A recording holds the commands the engine sent Redis for one run
(``capacity.record_run``: no broker, no polling) and the sources of its
scripts, which ``compare`` loads into its servers. Per run and version it
prints the Redis time of the scripts (``EVALSHA``, their own commands
included), that of every other command (scripts' commands included), the
commands counted, and the server's CPU.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import redis

from benchmarks.cases import capacity
from benchmarks.redisstats import command_stats, server_cpu_seconds
from celery_durable.broker.connection import script_source
from celery_durable.broker.ops import SCRIPT_NAMES
from celery_durable.local.redis_server import RedisServer
from celery_durable.testing.server import private_settings


def record(out: str, workflow: str = "bench.typical") -> None:
    settings = private_settings(prefix=capacity.PREFIX).model_copy(
        update={"key_prefix": capacity.PREFIX, "coordinator_queue": f"{capacity.PREFIX}.unserved"}
    )
    capacity.WORKFLOW = workflow
    run_id, sent = capacity.record_run(settings, [redis.Redis.from_url(settings.redis_url)])
    commands = [[a.decode("latin-1") if isinstance(a, bytes) else a for a in args] for args in sent]
    scripts = [script_source(name) for name in SCRIPT_NAMES]
    Path(out).write_text(json.dumps({"run_id": run_id, "sent": commands, "scripts": scripts}), encoding="utf-8")


def compare(runs: int, recordings: list[str]) -> None:
    sides: list[tuple[str, RedisServer, redis.Redis, dict[str, Any]]] = []
    try:
        for path in recordings:
            recorded = json.loads(Path(path).read_text(encoding="utf-8"))
            server = RedisServer(appendonly=False)
            server.start()
            raw = redis.Redis.from_url(server.url)
            sides.append((Path(path).name, server, raw, recorded))
            for source in recorded["scripts"]:
                raw.script_load(source)
            raw.config_resetstat()
        for n in range(runs):
            for _, _, raw, recorded in sides:
                new = f"{time.time_ns():016x}{n:016x}"[-32:]
                for args in capacity.again(recorded["sent"], recorded["run_id"], new):
                    raw.execute_command(*args)
        for name, _, raw, _ in sides:
            stats = command_stats(raw)
            scripts = stats.usec["evalsha"]
            server_us = server_cpu_seconds(raw) * 1e6
            other = (stats.total_usec - scripts) / runs
            print(
                f"{name:24s} scripts {scripts / runs:6.0f} us/run   other commands {other:5.0f} us/run"
                f"   commands {stats.total / runs:4.0f}/run   server CPU {server_us / runs:6.0f} us/run"
            )
    finally:
        for _, server, _, _ in sides:
            server.cleanup()


if __name__ == "__main__":
    if sys.argv[1:2] == ["record"]:
        record(*sys.argv[2:4])
    elif sys.argv[1:2] == ["compare"]:
        compare(int(sys.argv[2]), sys.argv[3:])
    else:
        sys.exit(__doc__)
