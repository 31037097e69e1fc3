"""Case 19's cluster rows: what a settled typical run costs a 3-master Redis Cluster.

The method of the one-Redis rows (``capacity.py``), on a cluster: one
``bench.typical`` run is recorded by an engine whose journal is the cluster
(so the commands are a cluster's: each index write an intent, the script and
a versioned sync, no MULTI), then stored ``count`` times with the run id
replaced. Each command goes to the master that serves its key's slot,
pipelined per master (redis-py's cluster pipeline refuses scripts, and every
command here touches one slot). Per master, ``INFO memory`` and ``INFO
commandstats`` before and after: memory per run, and the command time per
run that sizes a master's core. The same store on one Redis (the case's own
rows) is the comparison, measured the same way in the same process.

What a fleet adds is not here: the broker's commands go to a Redis of its
own or to RabbitMQ (kombu has no cluster transport), and the command time of
a replayed run is the engine's work with its round trips pipelined.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

from benchmarks.redisstats import command_stats, used_memory
from celery_durable import Engine, Settings

PIPELINE_RUNS = 50
SLOTS = 16_384


@dataclass(frozen=True)
class ClusterCost:
    """Per master, over the stored runs."""

    masters: int
    memory_per_run: list[float]
    command_usec_per_run: list[float]
    commands_per_run: list[float]
    build_seconds: float
    engine_commands_per_run: int


@contextlib.contextmanager
def cluster(root: Path) -> Iterator[Any]:
    from tests.support.topologies import RedisClusterNodes

    with RedisClusterNodes(root, appendfsync="everysec") as nodes:
        yield nodes


def _command_key(args: Sequence[Any]) -> str | None:
    """The key a recorded command is routed by; None for one with no key (it is not sent)."""
    name = str(args[0]).upper()
    if name in ("EVALSHA", "EVAL"):
        return str(args[3]) if int(args[2]) > 0 else None
    if name in ("PUBLISH", "PING", "INFO", "SCRIPT", "TIME") or len(args) < 2:
        return None
    return str(args[1])


def _slot_owners(servers: Sequence[redis.Redis]) -> list[int]:
    """Slot -> index of the server that serves it."""
    owners = [-1] * SLOTS
    ports = [int(server.connection_pool.connection_kwargs["port"]) for server in servers]
    for first, last, master, *_ in servers[0].execute_command("CLUSTER", "SLOTS"):
        owner = ports.index(int(master[1]))
        owners[int(first) : int(last) + 1] = [owner] * (int(last) - int(first) + 1)
    return owners


def store(servers: Sequence[redis.Redis], commands: Sequence[tuple[Any, ...]], old: str, count: int) -> None:
    """``count`` runs, each ``commands`` with its own run id, every command on its slot's master."""
    from benchmarks.cases.capacity import again

    owners = _slot_owners(servers)
    made = 0
    for start in range(0, count, PIPELINE_RUNS):
        pipes = [server.pipeline(transaction=False) for server in servers]
        for _ in range(min(PIPELINE_RUNS, count - start)):
            new = f"{time.time_ns():016x}{made:016x}"[-32:]
            made += 1
            for args in again(commands, old, new):
                key = _command_key(args)
                if key is not None:
                    pipes[owners[key_slot(key.encode())]].execute_command(*args)
        for pipe in pipes:
            for reply in pipe.execute(raise_on_error=False):
                if isinstance(reply, redis.ResponseError):
                    raise RuntimeError(f"a stored run's command failed on the cluster: {reply}")


def measure(base: Settings, prefix: str, count: int) -> ClusterCost:
    """Store ``count`` typical runs on a private 3-master cluster and weigh them per master."""
    from benchmarks.cases.capacity import record_run

    with tempfile.TemporaryDirectory(prefix="cd-cap-cluster-") as root, cluster(Path(root)) as nodes:
        servers = [redis.Redis(host="127.0.0.1", port=node.port) for node in nodes.nodes]
        settings = base.model_copy(update={
            "redis_url": nodes.url, "redis_cluster": True, "broker_url": base.redis_url,
            "key_prefix": prefix, "coordinator_queue": f"{prefix}.unserved",
        })
        original, commands = record_run(settings, servers)
        memory = [used_memory(server) for server in servers]
        stats = [command_stats(server) for server in servers]
        built = time.perf_counter()
        store(servers, commands, original, count)
        build_s = time.perf_counter() - built
        memory = [(used_memory(server) - before) / count for server, before in zip(servers, memory, strict=True)]
        spent = [command_stats(server) - before for server, before in zip(servers, stats, strict=True)]
        check = Engine([], settings).store.load_run(original)
        if check is None or check.status != "completed":
            raise RuntimeError("the recorded run is not a completed run on the cluster")
        for server in servers:
            server.close()
    return ClusterCost(
        masters=len(servers),
        memory_per_run=memory,
        command_usec_per_run=[s.total_usec / count for s in spent],
        commands_per_run=[s.total / count for s in spent],
        build_seconds=build_s,
        engine_commands_per_run=sum(1 for args in commands if _command_key(args) is not None),
    )
