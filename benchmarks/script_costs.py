"""Where one run's Redis commands go, script by script, and what it keeps once settled.

``python -m benchmarks.script_costs [workflow] [stored]`` (default
``bench.typical``, 2,000): one run of ``workflow`` is recorded in-process on a
private Redis (``capacity.record_run``: no broker, no polling, so the counts
are exact and do not depend on the machine's load), then sent again command by
command under ``INFO commandstats``, so each script's own commands (the
``redis.call`` inside it) are counted under it; then ``stored`` more runs are
built from the recording and weighed (``INFO memory``, ``MEMORY USAGE`` of
one run's keys). Issue 42 measured its levers with it.
"""

from __future__ import annotations

import hashlib
import sys
from collections import Counter, defaultdict

import redis

from benchmarks.cases import capacity
from benchmarks.redisstats import command_stats, used_memory
from celery_durable.broker.connection import script_source
from celery_durable.broker.ops import SCRIPT_NAMES
from celery_durable.testing.server import private_settings


def main(workflow: str = "bench.typical", stored: int = 2_000) -> None:
    settings = private_settings(prefix=capacity.PREFIX).model_copy(
        update={"key_prefix": capacity.PREFIX, "coordinator_queue": f"{capacity.PREFIX}.unserved"}
    )
    raw = redis.Redis.from_url(settings.redis_url)
    capacity.WORKFLOW = workflow
    run_id, sent = capacity.record_run(settings, [raw])
    names = {hashlib.sha1(script_source(name).encode()).hexdigest(): name for name in SCRIPT_NAMES}
    per: defaultdict[str, Counter[str]] = defaultdict(Counter)
    calls: Counter[str] = Counter()
    for args in capacity.again(sent, run_id, "f" * 32):
        name = str(args[0]).lower()
        if name == "evalsha":
            name = names.get(str(args[1]), "?")
        before = command_stats(raw)
        raw.execute_command(*args)
        per[name].update((command_stats(raw) - before).calls)
        calls[name] += 1
    total = sum(sum(counts.values()) for counts in per.values())
    print(f"{workflow}: {len(sent)} round trips, {total} Redis commands")
    for name, counts in sorted(per.items(), key=lambda item: -sum(item[1].values())):
        detail = " ".join(f"{command}={n}" for command, n in counts.most_common())
        print(f"  {name:18s} x{calls[name]:<3d} {sum(counts.values()):4d}  {detail}")
    before_bytes = used_memory(raw)
    ids = capacity._store(raw, sent, run_id, stored)
    print(f"memory per settled run over {stored:,} stored: {(used_memory(raw) - before_bytes) / stored:,.0f} B")
    print("one run's keys:", capacity._key_sizes(raw, ids[-1]))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench.typical", int(sys.argv[2]) if len(sys.argv) > 2 else 2_000)
