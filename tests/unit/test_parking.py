"""Kept bodies (``workflows/parking.py``, ``tasks/parked.py``) on the real
journal: a body parked at a call goes on from it when the journal shows
nothing past the call, and is unwound, never resumed, when it does."""

from __future__ import annotations

from typing import Any

from celery_durable import WorkflowContext, define_workflow
from celery_durable.broker.schema import value_outcome
from celery_durable.tasks.parked import ParkedRuns
from celery_durable.workflows.calls import CallRequest
from celery_durable.workflows.parking import ParkedBody
from celery_durable.workflows.passes import main_pass
from celery_durable.workflows.replay import Replay
from tests.unit.harness import Driver

RAN: list[str] = []


def two_calls(ctx: WorkflowContext) -> Any:
    RAN.append("top")
    first = ctx.call("a", "fleet.double", args=(1,))
    RAN.append("between")
    second = ctx.call("b", "fleet.double", args=(first,))
    return [first, second]


WF = define_workflow({"name": "two-calls", "description": "calls", "phases": []}, two_calls)


def kept(driver: Driver, sent: list[CallRequest]) -> tuple[Replay, ParkedBody]:
    replay = driver.replay(send_call=sent.append)
    return replay, ParkedBody(replay, lambda: main_pass(replay))


def answer(driver: Driver, key: str, value: Any) -> None:
    done = driver.store.call_done(driver.run_id, driver.epoch, key, value_outcome(value).encode(), "", f"wake-{key}")
    assert done == ["m"]


def test_a_kept_body_goes_on_from_its_call_without_replaying() -> None:
    RAN.clear()
    driver, sent, runs = Driver.of(WF), [], ParkedRuns(capacity=4, idle_seconds=60)
    _, body = kept(driver, sent)
    assert body.start().parked and [r.key for r in sent] == ["a"]
    runs.keep(driver.run_id, driver.epoch, body)
    assert runs.take(driver.run_id, driver.epoch) == (body, None)  # woken before the answer
    assert body.resume(None).parked and [r.key for r in sent] == ["a"]  # asks again, sends nothing
    runs.keep(driver.run_id, driver.epoch, body)

    answer(driver, "a", 2)
    taken = runs.take(driver.run_id, driver.epoch)
    assert taken is not None and taken[0] is body
    assert body.resume(taken[1]).parked and [r.key for r in sent] == ["a", "b"]
    runs.keep(driver.run_id, driver.epoch, body)
    answer(driver, "b", 4)
    taken = runs.take(driver.run_id, driver.epoch)
    assert taken is not None
    end = body.resume(taken[1])
    assert not end.parked and end.result() is not None and end.result().result_json == "[2,4]"
    assert RAN == ["top", "between"], "the body ran once, from the top to its end"
    assert runs.resumed == 3


def test_a_body_whose_run_went_on_elsewhere_is_unwound_not_resumed() -> None:
    RAN.clear()
    driver, sent, runs = Driver.of(WF), [], ParkedRuns(capacity=4, idle_seconds=60)
    _, stale = kept(driver, sent)
    assert stale.start().parked
    runs.keep(driver.run_id, driver.epoch, stale)
    answer(driver, "a", 2)
    _, elsewhere = kept(driver, sent)  # another worker process replays and reaches "b"
    assert elsewhere.start().parked and [r.key for r in sent] == ["a", "b"]
    assert runs.take(driver.run_id, driver.epoch) is None
    assert stale.join(timeout=10) and stale.replay.unwinding is not None
    assert RAN == ["top", "top", "between"], "the stale body went no further than its call"
    elsewhere.evict()
    assert elsewhere.join(timeout=10)
    assert RAN == ["top", "top", "between"]


def test_an_older_attempts_body_and_the_oldest_beyond_the_bound_are_unwound() -> None:
    runs = ParkedRuns(capacity=1, idle_seconds=60)
    first, second = Driver.of(WF), Driver.of(WF)
    _, one = kept(first, [])
    _, two = kept(second, [])
    assert one.start().parked and two.start().parked
    runs.keep(first.run_id, first.epoch, one)
    runs.keep(second.run_id, second.epoch, two)  # over the bound: the first is unwound
    assert len(runs) == 1 and one.join(timeout=10) and one.replay.unwinding is not None
    assert runs.take(second.run_id, second.epoch + 1) is None  # a newer attempt asks
    assert two.join(timeout=10) and two.replay.unwinding is not None and len(runs) == 0
