"""Schedules' firing cost (issue 38): N schedules every minute, one tick each
fired by the sweep's ``fire_due`` in one process on a private redis-server,
the broker stubbed (messages counted, not sent), the clock frozen a minute
on so exactly one tick per schedule is due. Prints the sweep's time per tick
and the Redis commands per tick (server side, those inside scripts included),
to compare 1,000 with 10,000 schedules (flat: the claim is O(due)).

    PYTHONPATH=. python benchmarks/schedule_firing.py 1000 10000
"""

import sys
import time
import uuid

import redis

from celery_durable import Engine, Settings, workflow
from celery_durable.schedules.firing import fire_due
from celery_durable.testing.server import environment_redis_url


@workflow(name="b", description="bench", phases=[])
def b(ctx):
    return None


class Stub:
    """The broker, counting what would be published."""

    sent = 0

    def send(self, messages):
        Stub.sent += len(messages)

    def send_call(self, *a):
        pass



def run(n):
    s = Settings(redis_url=environment_redis_url(), key_prefix=f"bench{uuid.uuid4().hex[:6]}", lease_seconds=30)
    e = Engine([b], s)
    e.sender = Stub()
    c = e.client()
    t0 = time.perf_counter()
    for i in range(n):
        c.create_schedule(f"s{i}", "b", every=60, overlap="allow_all")
    made = time.perf_counter() - t0
    store = e.store
    frozen = store.clock() + 61_000  # one tick due per schedule, and time stands still while they fire
    store.clock = lambda: frozen
    r = redis.Redis.from_url(s.redis_url)
    before = r.info("stats")["total_commands_processed"]
    t0 = time.perf_counter()
    sweeps = 0
    while True:
        sweeps += 1
        fire_due(e)
        due = r.zcount(store.keys.schedules_due, "-inf", store.clock())
        if due == 0:
            break
    spent = time.perf_counter() - t0
    after = r.info("stats")["total_commands_processed"]
    runs = r.zcard(store.keys.namespace("default").runs)
    print(f"N={n}: create {made/n*1e3:.2f} ms each; fired {runs} ticks in {sweeps} sweeps, {spent:.2f} s: "
          f"{spent/n*1e3:.3f} ms/tick, {(after-before)/n:.1f} Redis commands/tick, messages {Stub.sent}")
    Stub.sent = 0


if __name__ == "__main__":
    for n in map(int, sys.argv[1:]):
        run(n)
