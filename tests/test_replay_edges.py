"""Replay at its edges: user code that unwinds, attempts that diverge after a
failure, executions that die halfway, and storage that blips.

Faults are injected by wrapping a real store or engine method for one call,
the way DBOS places trigger points: Redis and the workers stay real.
"""

from __future__ import annotations

import enum
import threading
import time
from typing import Any

import pytest

from celery_durable import WorkflowContext
from celery_durable.broker.journal import BeginCall
from celery_durable.broker.redis_journal import RedisJournal
from celery_durable.errors import StorageUnavailableError
from tests.conftest import worker_thread
from tests.support.poll import RUN_BOUND, poll
from tests.support.workflows import wf


def wait_for_status(client: Any, run_id: str, status: str) -> Any:
    return poll(
        lambda: (envelope := client.get_workflow_run(run_id)).status == status and envelope,
        within=RUN_BOUND,
        what=f"run {run_id} to be {status}",
    )


def test_a_finally_block_around_a_fanout_does_not_run_during_the_suspended_pass(durable) -> None:
    cleanups: list[int] = []

    def run(ctx: WorkflowContext) -> Any:
        try:
            result = ctx.parallel([lambda: ctx.step("x", lambda: 1)])
        finally:
            ctx.step("cleanup", lambda: cleanups.append(1) or "ok")
        return result

    d = durable([wf("finally", run)])
    envelope = d.client.run_workflow("finally", timeout=20)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [1]
    assert cleanups == [1]


FLAKY = {"fail": True}


def test_a_branch_that_failed_runs_again_on_resume_and_may_take_another_path(durable) -> None:
    def flaky() -> int:
        if FLAKY["fail"]:
            raise ValueError("flaky")
        return 1

    def run(ctx: WorkflowContext) -> Any:
        first = ctx.parallel([lambda: ctx.step("flaky", flaky)])
        path = ctx.step("fallback" if first[0] is None else "primary", lambda: "taken")
        ctx.step("last", lambda: 2 if not FLAKY["fail"] else 1 / 0)
        return {"first": first, "path": path}

    d = durable([wf("diverge", run)])
    envelope = d.client.run_workflow("diverge", timeout=20)
    assert (envelope.status, envelope.can_resume) == ("error", True)
    FLAKY["fail"] = False
    resumed = d.client.resume_workflow(envelope.run_id, timeout=20)
    assert resumed.status == "completed", resumed.error
    assert resumed.result == {"first": [1], "path": "taken"}
    assert resumed.attempt == 2


def test_a_broker_that_refuses_the_branches_once_is_retried_in_place_and_they_are_sent(durable) -> None:
    """The pass dispatched its fan-out, then publishing failed: it runs again
    in place (the same message, the same lock) and sends the branches (a
    task each: branch_batch_ms 0, or the pass would run them itself)."""
    d = durable([wf("redeliver", lambda ctx: ctx.parallel([lambda: 1, lambda: 2]))], branch_batch_ms=0)
    real_send = d.engine.send_branches
    refused = threading.Event()

    def refuse_the_first_send(*args: Any, **kwargs: Any) -> list[str]:
        if not refused.is_set():
            refused.set()
            raise ConnectionError("broker connection reset")
        return real_send(*args, **kwargs)

    d.engine.send_branches = refuse_the_first_send  # type: ignore[method-assign]
    run_id = d.client.start_workflow("redeliver")
    assert refused.wait(10)
    envelope = d.client.wait_for_workflow_run(run_id, timeout=20)
    assert envelope.status == "completed"
    assert envelope.result == [1, 2]
    assert envelope.attempt == 1


def test_a_hand_off_the_broker_refuses_leaves_the_branches_to_the_pass_that_runs_them(durable) -> None:
    """A narrow fan-out runs in the coordinator's pass, which hands slow
    branches on as tasks. When that publish fails, the broker error ends the
    pass before its next op, and it runs again in place: each pass journals
    the branches it ran (a completion held for the next branch's begin
    included), so each step ran once, and the attempt is the first."""
    ran: list[int] = []

    def slow(i: int) -> int:
        ran.append(i)
        time.sleep(0.15)
        return i

    def run(ctx: WorkflowContext) -> Any:
        return ctx.parallel([lambda i=i: ctx.step(f"slow-{i}", lambda: slow(i)) for i in range(3)])

    d = durable([wf("hand-off-refused", run)], branch_batch_ms=30)
    refused = threading.Event()

    def refuse(*args: Any, **kwargs: Any) -> list[str]:
        refused.set()
        raise ConnectionError("broker connection reset")

    d.engine.send_branches = refuse  # type: ignore[method-assign]
    envelope = d.client.run_workflow("hand-off-refused", timeout=20)
    assert refused.is_set(), "the first branch ran past branch_batch_ms: the rest was handed on"
    assert (envelope.status, envelope.result, envelope.attempt) == ("completed", [0, 1, 2], 1), envelope.error
    assert sorted(ran) == [0, 1, 2]


def test_an_activation_that_finds_a_dead_pass_holding_the_lock_comes_back_when_it_expires(
    durable, raw_redis
) -> None:
    d = durable([wf("locked", lambda ctx: ctx.step("a", lambda: 1))], worker=False)
    run_id = d.client.start_workflow("locked")
    keys = d.engine.store.run_keys(run_id)
    # A pass whose process was killed: its lock is still valid for 1.5 s.
    raw_redis.hset(keys.run, mapping={"lock": "dead-pass", "lock_until": str(int(time.time() * 1000) + 1500)})
    with worker_thread(d.engine, concurrency=2):
        envelope = d.client.wait_for_workflow_run(run_id, timeout=20)
    assert envelope.status == "completed"
    assert envelope.result == 1


def test_a_storage_error_swallowed_by_workflow_code_stays_fatal_for_the_pass(durable, monkeypatch) -> None:
    real = RedisJournal.begin
    blips: list[str] = []

    def blip_once(self: RedisJournal, seq: str, call: BeginCall) -> Any:
        if call.step_key == "a" and not blips:
            blips.append(self.run_id)
            raise StorageUnavailableError("injected blip")
        return real(self, seq, call)

    monkeypatch.setattr(RedisJournal, "begin", blip_once)

    def run(ctx: WorkflowContext) -> Any:
        # A user who swallows everything must not shift the journal.
        try:  # noqa: SIM105
            ctx.step("a", lambda: 1)
        except Exception:
            pass
        ctx.step("b", lambda: 2)
        return ctx.parallel([lambda: 3])

    d = durable([wf("swallow", run)])
    envelope = d.client.run_workflow("swallow", timeout=30)
    assert blips, "the fault was injected"
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [3]


def test_a_storage_blip_in_a_branch_is_retried(durable, monkeypatch) -> None:
    real = RedisJournal.begin
    blips: list[str] = []

    def blip_once(self: RedisJournal, seq: str, call: BeginCall) -> Any:
        if seq != "m" and not blips:
            blips.append(seq)
            raise StorageUnavailableError("injected blip")
        return real(self, seq, call)

    monkeypatch.setattr(RedisJournal, "begin", blip_once)
    d = durable([wf("blip", lambda ctx: ctx.parallel([lambda: ctx.step("x", lambda: 1)]))])
    envelope = d.client.run_workflow("blip", timeout=30)
    assert blips == ["m.0.0"]
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [1]


class Colour(str, enum.Enum):  # noqa: UP042  (the str mix-in is the point)
    RED = "red"


def test_the_first_run_sees_the_journaled_json_not_the_producers_object(durable) -> None:
    def run(ctx: WorkflowContext) -> Any:
        colour = ctx.step("colour", lambda: Colour.RED)
        ctx.step(f"paint-{colour}", lambda: 1)  # f"{Colour.RED}" would differ from f"{'red'}"
        return ctx.parallel([lambda: colour])

    d = durable([wf("enum", run)])
    envelope = d.client.run_workflow("enum", timeout=20)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == ["red"]


def test_an_idempotent_start_whose_first_send_failed_is_sent_again(durable) -> None:
    d = durable([wf("idem", lambda ctx: 1)])
    real = d.engine.deliver
    failed: list[str] = []

    def fail_once(wakes: Any) -> None:
        if not failed:
            failed.append(wakes[0].run_id)
            raise ConnectionError("broker down")
        real(wakes)

    d.engine.deliver = fail_once  # type: ignore[method-assign]
    with pytest.raises(StorageUnavailableError, match="broker down"):
        d.client.start_workflow("idem", idempotency_key="k1")
    run_id = d.client.start_workflow("idem", idempotency_key="k1")
    assert run_id == failed[0]
    envelope = d.client.wait_for_workflow_run(run_id, timeout=20)
    assert envelope.status == "completed"


def test_progress_logged_inside_a_step_that_runs_again_on_resume_is_kept(durable) -> None:
    def run(ctx: WorkflowContext) -> Any:
        def produce() -> int:
            ctx.log(f"inside a, attempt {ctx.attempt}")
            if ctx.attempt == 1:
                raise ValueError("first attempt fails")
            return 1

        ctx.step("a", produce)
        return "ok"

    d = durable([wf("plog", run)])
    envelope = d.client.run_workflow("plog", timeout=20)
    assert envelope.status == "error"
    resumed = d.client.resume_workflow(envelope.run_id, timeout=20)
    assert resumed.status == "completed"
    messages = [r.message for r in d.client.get_workflow_run_progress(envelope.run_id).records]
    assert messages.count("inside a, attempt 1") == 1
    assert messages.count("inside a, attempt 2") == 1


def test_values_of_an_abandoned_future_are_not_reused_after_a_cut(durable) -> None:
    """Attempt 1 fails a step, then calls now(); attempt 2 re-runs the step and
    takes another path where uuid4() stands at the same index."""

    def run(ctx: WorkflowContext) -> Any:
        try:
            ctx.step("gate", lambda: 1 if ctx.attempt > 1 else 1 / 0)
        except Exception:
            ctx.now()
            raise
        return str(ctx.uuid4())

    d = durable([wf("cutvalues", run)])
    envelope = d.client.run_workflow("cutvalues", timeout=20)
    assert envelope.status == "error"
    resumed = d.client.resume_workflow(envelope.run_id, timeout=20)
    assert resumed.status == "completed", resumed.error
    assert len(resumed.result) == 36  # a UUID, not attempt 1's timestamp
