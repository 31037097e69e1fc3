"""Costs that must not explode: straight lines of steps replay nothing."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from celery_durable import WorkflowContext, define_workflow
from tests.conftest import worker_thread
from tests.support.poll import RUN_BOUND, poll

CALLS: Counter[str] = Counter()
LOCK = threading.Lock()


def count(name: str) -> None:
    with LOCK:
        CALLS[name] += 1


def straight_line(ctx: WorkflowContext) -> Any:
    count(f"{ctx.run_id}:body")
    total = 0
    for i in range(300):
        total = ctx.step(f"s{i}", lambda total=total, i=i: total + i)
    return total


def with_fanout(ctx: WorkflowContext) -> Any:
    count(f"{ctx.run_id}:body")
    before = [ctx.step(f"a{i}", lambda i=i: i) for i in range(50)]
    fanned = ctx.parallel([lambda i=i: ctx.step(f"p{i}", lambda i=i: i * 2) for i in range(4)])
    after = [ctx.step(f"b{i}", lambda i=i: i) for i in range(50)]
    return sum(before) + sum(fanned) + sum(after)


def wide_fanout(ctx: WorkflowContext) -> Any:
    return sum(ctx.parallel([lambda i=i: ctx.step(f"w{i}", lambda i=i: i) for i in range(WIDTH)]))


WIDTH = 200
LINE = define_workflow({"name": "line", "description": "300 steps", "phases": []}, straight_line)
FAN = define_workflow({"name": "fan-cost", "description": "steps around a fan-out", "phases": []}, with_fanout)
WIDE = define_workflow({"name": "wide-cost", "description": "a parallel of one step each", "phases": []}, wide_fanout)


def test_sequential_steps_run_in_one_pass_of_the_workflow_body(durable) -> None:
    d = durable([LINE])
    envelope = d.client.run_workflow("line", timeout=60)
    assert envelope.status == "completed"
    assert envelope.result == sum(range(300))
    assert envelope.snapshot["steps_done"] == 300
    assert CALLS[f"{envelope.run_id}:body"] == 1, "n sequential steps must not cost n replays"


def test_a_narrow_fanout_of_quick_branches_runs_in_the_coordinators_one_pass(durable) -> None:
    """Four quick branches: the pass that dispatched them runs them
    (``InlineBranches``), with no branch task and no second pass."""
    d = durable([FAN])
    envelope = d.client.run_workflow("fan-cost", timeout=60)
    assert envelope.status == "completed"
    assert envelope.result == sum(range(50)) * 2 + 12
    assert CALLS[f"{envelope.run_id}:body"] == 1


def test_a_fanout_wider_than_one_task_costs_one_more_coordinator_pass_and_one_replay_per_branch_task(
    durable,
) -> None:
    # fanout_tasks 2: four branches start as two tasks, so the pass sends them.
    d = durable([FAN], fanout_tasks=2, branch_batch_ms=60_000)
    envelope = d.client.run_workflow("fan-cost", timeout=60)
    assert envelope.status == "completed"
    assert envelope.result == sum(range(50)) * 2 + 12
    # Two coordinator passes (before and after the fan-out) plus one replay
    # per branch task, or fewer: a task that starts after another's replay
    # reached the fan-out runs from the thunks it kept.
    assert 2 + 1 <= CALLS[f"{envelope.run_id}:body"] <= 2 + 2


def test_without_batching_each_branch_is_its_own_task_and_replay(durable) -> None:
    d = durable([FAN], branch_batch_ms=0, parked_executions=0)
    envelope = d.client.run_workflow("fan-cost", timeout=60)
    assert envelope.status == "completed"
    assert CALLS[f"{envelope.run_id}:body"] == 2 + 4


def test_branch_tasks_of_one_process_share_the_thunks_one_replay_built(durable) -> None:
    """Each branch its own task: one replays the body, and a task that starts
    after that replay reached the fan-out runs from the kept thunks."""
    d = durable([FAN], branch_batch_ms=0)
    envelope = d.client.run_workflow("fan-cost", timeout=60)
    assert envelope.status == "completed"
    assert envelope.result == sum(range(50)) * 2 + 12
    replays = CALLS[f"{envelope.run_id}:body"] - 2
    assert 1 <= replays <= 4
    assert replays + d.engine.kept_fanouts.used == 4, "every branch task either replayed or used the kept thunks"


def test_a_solo_pool_worker_runs_a_fanout_without_deadlock(durable) -> None:
    """One worker slot for coordinator and branches: the fan-out suspends instead of waiting in the slot."""
    d = durable([FAN], worker=False)
    with worker_thread(d.engine, pool="solo", concurrency=1):
        envelope = d.client.run_workflow("fan-cost", timeout=60)
    assert envelope.status == "completed"
    assert envelope.result == sum(range(50)) * 2 + 12


def test_a_straight_line_step_costs_one_journal_script(durable, raw_redis) -> None:
    """Each step's write travels with the next call's begin: n steps, about n
    fenced scripts (plus a handful for start, activation and finish), not 2n."""
    d = durable([LINE])
    d.client.run_workflow("line", timeout=60)  # scripts loaded, worker warm

    before = scripts(raw_redis)
    envelope = d.client.run_workflow("line", timeout=60)
    spent = scripts(raw_redis) - before
    assert envelope.result == sum(range(300))
    assert envelope.snapshot["steps_done"] == 300
    assert 300 <= spent <= 300 + 30, spent


def test_a_branch_of_one_step_costs_one_script(durable, raw_redis) -> None:
    """A branch task reads the sequences of the branches it holds in one
    round trip ahead of them (``FanoutOps._read_ahead``), a branch's last
    step is journaled with the branch's outcome (``complete_held``), and that
    completion travels with the next branch's begin (``complete_begin``): so
    each branch is one script, where it was four, then two. (Its task's
    last branch is two.) No branch is handed on (that costs a task and a
    replay more, and depends on how loaded the machine is)."""
    d = durable([WIDE], branch_batch_ms=60_000)
    d.client.run_workflow("wide-cost", timeout=60)  # scripts loaded, worker warm
    before = scripts(raw_redis)
    envelope = d.client.run_workflow("wide-cost", timeout=60)
    spent = scripts(raw_redis) - before
    assert envelope.result == sum(range(WIDTH))
    assert envelope.snapshot["steps_done"] == WIDTH
    tasks = 4  # first_chunks: 200 branches start as a task per 64, so 4 tasks
    assert WIDTH + tasks <= spent <= WIDTH + tasks + 40, spent  # it was 2 * WIDTH and more


def scripts(raw_redis: Any) -> int:
    """Lua scripts Redis has run so far."""
    stats = raw_redis.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))


def logged(ctx: WorkflowContext) -> Any:
    for i in range(5):
        ctx.step(f"s{i}", lambda i=i: i)
        ctx.log(f"step {i} done")
    return 5


LOGGED = define_workflow({"name": "logged-cost", "description": "steps and records", "phases": []}, logged)


def logged_then_fails(ctx: WorkflowContext) -> Any:
    logged(ctx)
    raise RuntimeError("after the records")


FAILS_AFTER_LOGS = define_workflow(
    {"name": "logged-fails", "description": "steps and records, then fails", "phases": []}, logged_then_fails
)


def test_a_settled_runs_streams_keep_no_room_for_appends(durable, raw_redis) -> None:
    """Redis sets up to 4 KB aside in a stream's last node for appends, which
    a settled run never makes: the settle compacts its progress and history
    (``retain_run``), every record still there to read. A run that can resume
    (here, an error) keeps them so; a completed one folds them into its
    archive (issue 42), smaller still."""
    d = durable([LOGGED, FAILS_AFTER_LOGS])
    failed = d.client.run_workflow("logged-fails", timeout=60)
    assert (failed.status, failed.can_resume) == ("error", True)
    keys = d.engine.store.run_keys(failed.run_id)
    poll(lambda: raw_redis.pttl(keys.progress) > 0, within=RUN_BOUND, what="the retention clock")
    for key in (keys.progress, keys.history):
        assert raw_redis.memory_usage(key, samples=0) < 2048, key
    messages = [entry["message"] for _, entry in raw_redis.xrange(keys.progress)]
    assert [m for m in messages if m.startswith("step")] == [f"step {i} done" for i in range(5)]
    assert raw_redis.pttl(keys.progress) > 0 and raw_redis.pttl(keys.history) > 0

    envelope = d.client.run_workflow("logged-cost", timeout=60)
    assert envelope.status == "completed"
    keys = d.engine.store.run_keys(envelope.run_id)
    poll(lambda: raw_redis.exists(keys.archive), within=RUN_BOUND, what="the archive")
    assert raw_redis.memory_usage(keys.archive, samples=0) < 2048
    assert not raw_redis.exists(keys.progress, keys.history)
    messages = [r.message for r in d.client.get_workflow_run_progress(envelope.run_id).records]
    assert [m for m in messages if m.startswith("step")] == [f"step {i} done" for i in range(5)]
    assert raw_redis.pttl(keys.archive) > 0


def test_only_a_run_that_asked_a_throttle_for_a_slot_has_its_slots_looked_for_when_it_settles(durable) -> None:
    """Giving slots back reads the run's holds (a round trip); ``finish.lua``
    says whether the run ever asked for one, so an unthrottled settle skips it."""
    d = durable([LOGGED])
    d.client.set_throttle("cost-t", concurrency=1)
    looked: list[str] = []
    gave_back = threading.Event()
    give_back = d.engine.store.after_settle
    assert give_back is not None

    def recording(run_id: str) -> None:
        give_back(run_id)
        looked.append(run_id)
        gave_back.set()

    d.engine.store.after_settle = recording
    plain = d.client.run_workflow("logged-cost", timeout=60)
    throttled_id = d.client.start_workflow("logged-cost", throttle="cost-t")
    throttled = d.client.wait_for_workflow_run(throttled_id, timeout=60)
    assert plain.status == throttled.status == "completed"
    # The settling pass gives back after the record says completed: waited for, in its thread.
    assert gave_back.wait(30)
    assert looked == [throttled_id]
    assert d.client.get_throttle("cost-t").holding == 0
