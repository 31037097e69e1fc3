"""A message the broker refuses after the run counted it in flight (issue 25
items 1 and 2): forgotten at once (``unsent.lua``), so that the run is judged
by what it really has in flight and the sweep finds what the lost message was
to do — never a run that hangs for good, never a healthy one taken over.

The broker's refusal is the engine's own sender raising kombu's error for the
messages a test picks, on a real worker with its real sweep.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from kombu.exceptions import OperationalError

from celery_durable import Engine, StorageUnavailableError, WorkflowContext, workflow
from celery_durable.broker import RunRecord
from celery_durable.tasks.sending import Outgoing, Sender
from celery_durable.workflows.calls import CallRequest
from tests.conftest import DurableFactory
from tests.support.waits import waiting_for_the_signal

TIMEOUT = 30


class RefusingSender:
    """The engine's sender, refusing the next ``times`` messages ``picks`` picks."""

    def __init__(self, inner: Sender, picks: Callable[[Outgoing], bool], times: int = 1) -> None:
        self.inner, self.picks, self.left, self.refused = inner, picks, times, 0

    def send(self, messages: Sequence[Outgoing]) -> None:
        if self.left and any(self.picks(m) for m in messages):
            self.left -= 1
            self.refused += 1
            raise OperationalError("the broker refused the message (a test)")
        self.inner.send(messages)

    def send_call(self, engine: Engine, record: RunRecord, request: CallRequest) -> None:
        self.inner.send_call(engine, record, request)


@workflow(name="approval", description="Waits for a signal, no timeout", phases=[])
def approval(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("approve").payload


def test_a_signal_whose_wake_the_broker_refuses_is_kept_and_the_run_goes_on(durable: DurableFactory) -> None:
    """signal.lua removed the wait and counted the wake; the publish failed, and
    nothing brought the run back: no due time, the sweep no longer watching."""
    d = durable([approval])
    run_id = d.client.start_workflow("approval")
    waiting_for_the_signal(d, run_id)
    inner = d.engine.sender
    d.engine.sender = RefusingSender(inner, lambda m: m.kwargs.get("run_id") == run_id)
    with pytest.raises(StorageUnavailableError, match="the signal is kept"):
        d.client.signal_workflow_run(run_id, "approve", {"by": "ops"})
    d.engine.sender = inner
    done = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert (done.status, done.result) == ("completed", {"by": "ops"})
    assert done.attempt == 2, "taken over by the sweep, which found the run with nothing to move it"


def test_a_cancel_whose_message_the_broker_refuses_still_cancels_a_waiting_run(durable: DurableFactory) -> None:
    d = durable([approval])
    run_id = d.client.start_workflow("approval")
    waiting_for_the_signal(d, run_id)
    inner = d.engine.sender
    d.engine.sender = RefusingSender(inner, lambda m: m.kwargs.get("run_id") == run_id)
    with pytest.raises(StorageUnavailableError):
        d.client.cancel_workflow_run(run_id, timeout=TIMEOUT)
    d.engine.sender = inner
    done = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert (done.status, done.reason) == ("cancelled", "cancelled")


@workflow(name="pair-then-wait", description="Two steps in parallel, then a signal", phases=[])
def pair_then_wait(ctx: WorkflowContext) -> Any:
    pair = ctx.parallel([lambda: ctx.step("a", lambda: "a"), lambda: ctx.step("b", lambda: "b")])
    return [pair, ctx.wait_for_signal("approve").payload]


@pytest.mark.topologies("redis", "cluster")
def test_branch_tasks_the_broker_refused_are_not_left_in_flight_to_count_a_wait_as_work(
    durable: DurableFactory,
) -> None:
    """Counted, then refused, and sent again by the pass run again in place: the
    refused ids stayed 'queued', so the run waiting afterwards counted active
    time (timeout_seconds after 2.3 s in the audit) or was taken over once the
    steps queue was seen empty, healthy as it was."""
    d = durable([pair_then_wait], branch_batch_ms=0)  # each branch a task of its own
    inner = d.engine.sender
    refusing = RefusingSender(inner, lambda m: m.task == "celery_durable.branch")
    d.engine.sender = refusing
    run_id = d.client.start_workflow("pair-then-wait", limits={"timeout_seconds": 3})
    waiting_for_the_signal(d, run_id)  # the sweep has looked at it, and saw it waiting
    assert refusing.refused == 1
    store = d.engine.store
    assert store.client.hgetall(store.run_keys(run_id).live) == {}, "nothing in flight while it waits"
    waited = d.client.get_workflow_run(run_id)
    assert (waited.status, waited.attempt) == ("running", 1)
    d.client.signal_workflow_run(run_id, "approve", "yes")
    done = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert (done.status, done.result, done.attempt) == ("completed", [["a", "b"], "yes"], 1)
