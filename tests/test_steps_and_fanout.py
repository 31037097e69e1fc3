"""Steps, fan-out, replay-safe values, progress and args against SPEC §2, §4 and §7.

Every test runs real workflows on a real Celery worker (threads pool) over the
session's real Redis. Workers run in this process, so producers record what
they did in module-level state guarded by a lock; an autouse fixture resets it.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import Counter
from datetime import UTC, timedelta
from typing import Any

import pytest
from celery.signals import task_prerun

from celery_durable import (
    JSON_NULL,
    StepFailed,
    WorkflowDefinitionError,
    define_workflow,
    workflow,
)
from celery_durable.tasks.app import BRANCH_TASK

TIMEOUT = 30

_LOCK = threading.Lock()
CALLS: Counter[str] = Counter()
RECORDS: list[Any] = []


@pytest.fixture(autouse=True)
def _reset_shared_state() -> None:
    with _LOCK:
        CALLS.clear()
        RECORDS.clear()


def count(name: str) -> int:
    """Count one call of ``name``; returns how many calls there were so far."""
    with _LOCK:
        CALLS[name] += 1
        return CALLS[name]


def calls(name: str) -> int:
    with _LOCK:
        return CALLS[name]


def record(item: Any) -> None:
    with _LOCK:
        RECORDS.append(item)


class Boom(Exception):
    """A user error whose type name StepFailed must carry."""


class Opaque:
    """Not a JSON value."""


# -- steps ---------------------------------------------------------------------


@workflow(name="journal", description="journals a step and replays it", phases=[])
def journal_wf(ctx):
    count("body")
    first = ctx.step("a", lambda: count("producer-a") and {"n": 1, "items": [1, 2.5, "x", None, True]})
    live = ctx.step("v", lambda: count("producer-v"), volatile=True)
    record(("volatile", live))
    # A fan-out sent as a task (branch_batch_ms 0) suspends the pass: the main
    # body is replayed (in the branch task and in the coordinator's next pass),
    # so step "a" is read back from the journal.
    fanned = ctx.parallel([lambda: 7])
    again = ctx.step("a", lambda: count("producer-a-again") and "never")
    return {"first": first, "again": again, "fanned": fanned}


def test_a_step_runs_once_per_key_and_a_repeated_key_returns_the_journaled_value(durable) -> None:
    d = durable([journal_wf], branch_batch_ms=0)
    envelope = d.client.run_workflow("journal", timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    value = {"n": 1, "items": [1, 2.5, "x", None, True]}
    assert envelope.result == {"first": value, "again": value, "fanned": [7]}
    # The body ran more than once (replays), yet the producer ran exactly once.
    assert calls("body") >= 2
    assert calls("producer-a") == 1
    assert calls("producer-a-again") == 0
    # volatile: the producer ran on every execution of the body, nothing journaled.
    assert calls("producer-v") == calls("body")
    assert [live for kind, live in RECORDS if kind == "volatile"] == list(range(1, calls("body") + 1))
    detail = d.client.get_workflow_run_detail(envelope.run_id)
    rows = {row.key: row.status for row in detail.steps}
    assert rows.get("a") == "completed"
    assert "v" not in rows


BAD_RESULTS = {
    "tuple": lambda: (1, 2),
    "set": lambda: {1, 2},
    "nan": lambda: math.nan,
    "object": lambda: Opaque(),
    "nested": lambda: {"ok": [1, {"deep": math.inf}]},
    "int-key": lambda: {1: "one"},
}


@workflow(name="non-json", description="steps that return non-JSON values", phases=[])
def non_json_wf(ctx):
    seen = []
    for key, producer in BAD_RESULTS.items():
        try:
            ctx.step(key, lambda producer=producer, key=key: count(f"producer-{key}") and producer())
        except StepFailed as exc:
            record((key, exc))
            seen.append(key)
    try:
        ctx.step("volatile-set", lambda: count("producer-volatile-set") and {3}, volatile=True)
    except StepFailed as exc:
        record(("volatile-set", exc))
        seen.append("volatile-set")
    # The last one fails on the first attempt only: it is not journaled, so a
    # resumed run calls its producer again.
    value = ctx.step("retry-me", lambda: ("no", "tuple") if count("producer-retry-me") == 1 else ["a", "list"])
    return {"failed": seen, "value": value}


def test_a_non_json_step_result_fails_that_step_and_is_not_journaled(durable) -> None:
    d = durable([non_json_wf])
    envelope = d.client.run_workflow("non-json", timeout=TIMEOUT)
    assert envelope.status == "error"
    assert envelope.reason == "exception"
    assert envelope.can_resume is True
    assert "retry-me" in envelope.error
    assert "Step result must be a JSON value: retry-me" in envelope.error
    failures = {key: exc for key, exc in RECORDS}
    assert set(failures) == {*BAD_RESULTS, "volatile-set"}
    for key, exc in failures.items():
        assert isinstance(exc, StepFailed)
        assert exc.key == key
        assert isinstance(exc.error_type, str) and exc.error_type
        assert exc.error_message == f"Step result must be a JSON value: {key}"
        assert f"Step result must be a JSON value: {key}" in str(exc)
        assert calls(f"producer-{key}") >= 1
    detail = d.client.get_workflow_run_detail(envelope.run_id)
    assert all(row.status != "completed" for row in detail.steps), detail.steps

    resumed = d.client.resume_workflow(envelope.run_id, timeout=TIMEOUT)
    assert resumed.status == "completed", resumed.error
    assert calls("producer-retry-me") == 2
    assert resumed.result == {"failed": [*BAD_RESULTS, "volatile-set"], "value": ["a", "list"]}


@workflow(name="raises", description="a producer that raises", phases=[])
def raises_wf(ctx):
    def explode():
        count("producer-explode")
        raise Boom("disk on fire 42")

    if ctx.args.get("catch"):
        try:
            ctx.step("explode", explode)
        except StepFailed as exc:
            return {"key": exc.key, "type": exc.error_type, "message": exc.error_message, "text": str(exc)}
        return "not raised"
    return ctx.step("explode", explode)


def test_a_producer_that_raises_reaches_the_workflow_as_step_failed(durable) -> None:
    d = durable([raises_wf])
    caught = d.client.run_workflow("raises", args={"catch": True}, timeout=TIMEOUT)
    assert caught.status == "completed", caught.error
    assert caught.result["key"] == "explode"
    assert caught.result["type"] == "Boom"
    assert caught.result["message"] == "disk on fire 42"
    assert "disk on fire 42" in caught.result["text"]

    uncaught = d.client.run_workflow("raises", timeout=TIMEOUT)
    assert uncaught.status == "error"
    assert uncaught.reason == "exception"
    assert uncaught.can_resume is True
    assert "explode" in uncaught.error
    assert "disk on fire 42" in uncaught.error
    assert "has_result" in uncaught.to_dict() and uncaught.has_result is False
    assert calls("producer-explode") == 2


# -- run results and args ----------------------------------------------------------


@workflow(name="results", description="returns what args ask for", phases=[])
def results_wf(ctx):
    mode = ctx.args.get("mode", "args")
    if mode == "none":
        return None
    if mode == "null":
        return JSON_NULL
    if mode == "set":
        return {1, 2}
    if mode == "nan":
        return [1.0, math.nan]
    return ctx.args


def test_run_results_none_json_null_non_json_and_verbatim_keys(durable) -> None:
    d = durable([results_wf])
    client = d.client

    none = client.run_workflow("results", args={"mode": "none"}, timeout=TIMEOUT)
    assert none.status == "completed" and none.reason is None
    assert none.has_result is False
    assert "result" not in none.to_dict()
    assert none.to_dict()["has_result"] is False

    null = client.run_workflow("results", args={"mode": "null"}, timeout=TIMEOUT)
    assert null.status == "completed"
    assert null.has_result is True
    assert null.result is None
    assert "result" in null.to_dict() and null.to_dict()["result"] is None

    for mode in ("set", "nan"):
        bad = client.run_workflow("results", args={"mode": mode}, timeout=TIMEOUT)
        assert bad.status == "error", mode
        assert "Workflow result must be a JSON value" in bad.error
        assert bad.has_result is False
        assert "result" not in bad.to_dict()

    payload = {"mode": "args", "snake_key": 1, "camelKey": {"innerKey": [{"x_y": None}]}, "Mixed-Case Key": "v"}
    verbatim = client.run_workflow("results", args=payload, timeout=TIMEOUT)
    assert verbatim.status == "completed", verbatim.error
    assert verbatim.result == payload
    assert verbatim.args == payload
    assert verbatim.to_dict()["result"] == payload

    default = client.run_workflow("results", timeout=TIMEOUT)
    assert default.status == "completed", default.error
    assert default.args == {}
    assert default.result == {}


@workflow(
    name="typed",
    description="declares an args schema",
    phases=[],
    args_schema={
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"type": "integer"}}},
        "required": ["items"],
    },
)
def typed_wf(ctx):
    return ctx.args


@workflow(name="untyped", description="no args schema", phases=[])
def untyped_wf(ctx):
    return ctx.args


def test_bad_args_are_refused_before_any_run_exists(durable) -> None:
    d = durable([typed_wf, untyped_wf], worker=False)
    client = d.client
    for bad in ({"s": {1, 2}}, {"t": (1, 2)}, {"f": math.nan}, {1: "int key"}, Opaque()):
        with pytest.raises(ValueError):
            client.start_workflow("untyped", args=bad)
    with pytest.raises(ValueError):
        client.run_workflow("untyped", args={"s": {1}}, timeout=5)
    with pytest.raises(ValueError) as excinfo:
        client.start_workflow("typed", args={"items": [1, "two"]})
    assert re.search(r"items.*1", str(excinfo.value)), str(excinfo.value)
    with pytest.raises(ValueError) as excinfo:
        client.start_workflow("typed", args={})
    assert "items" in str(excinfo.value)
    with pytest.raises(ValueError):
        client.run_workflow("typed", args={"items": "nope"}, timeout=5)
    assert client.list_workflow_runs().runs == []

    # Valid args do create a run (nobody consumes it: this engine has no worker).
    run_id = client.start_workflow("typed", args={"items": [1, 2]})
    assert [run.run_id for run in client.list_workflow_runs().runs] == [run_id]
    assert client.get_workflow_run(run_id).args == {"items": [1, 2]}


# -- parallel -----------------------------------------------------------------------


def _ordered_thunk(ctx, i: int):
    def produce() -> str:
        # Later thunks finish first, so results come back out of finishing order.
        time.sleep(0.05 * (5 - i))
        count(f"thunk-{i}")
        if i == 2:
            raise Boom("thunk 2 failed")
        return f"r{i}"

    def thunk() -> Any:
        if i == 3:
            raise Boom("plain exception outside a step")
        return ctx.step(f"t{i}", produce)

    return thunk


@workflow(name="ordered", description="parallel results in order", phases=[])
def ordered_wf(ctx):
    return ctx.parallel([_ordered_thunk(ctx, i) for i in range(5)])


def test_parallel_returns_results_in_order_and_a_failing_thunk_yields_none(durable) -> None:
    d = durable([ordered_wf])
    envelope = d.client.run_workflow("ordered", timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == ["r0", "r1", None, None, "r4"]
    assert [calls(f"thunk-{i}") for i in range(5)] == [1, 1, 1, 0, 1]


@workflow(name="wide", description="eight one-second steps in parallel", phases=[])
def wide_wf(ctx):
    def thunk(i: int) -> Any:
        def produce() -> int:
            start = time.monotonic()
            time.sleep(1.0)
            record((i, start, time.monotonic()))
            return i

        return ctx.step(f"slow-{i}", produce)

    return ctx.parallel([lambda i=i: thunk(i) for i in range(8)])


@pytest.mark.topologies("redis", "rabbitmq")
def test_parallel_branches_really_run_concurrently(durable) -> None:
    d = durable([wide_wf], concurrency=8)
    started = time.monotonic()
    envelope = d.client.run_workflow("wide", timeout=TIMEOUT)
    wall = time.monotonic() - started
    assert envelope.status == "completed", envelope.error
    assert envelope.result == list(range(8))
    assert wall < 4.0, f"8 parallel 1s steps took {wall:.2f}s"
    intervals = sorted(RECORDS)
    assert [i for i, _, _ in intervals] == list(range(8))
    # All eight intervals share a common instant: they overlapped.
    latest_start = max(start for _, start, _ in intervals)
    earliest_end = min(end for _, _, end in intervals)
    assert latest_start < earliest_end, intervals


@workflow(name="quick-then-slow", description="eight quick branches, then four slow ones", phases=[])
def quick_then_slow_wf(ctx):
    quick = ctx.parallel([lambda i=i: ctx.step(f"quick-{i}", lambda i=i: i) for i in range(8)])
    slow = ctx.parallel([lambda i=i: ctx.step(f"slow-{i}", lambda i=i: (time.sleep(0.6), i)[1]) for i in range(4)])
    return quick + slow


def test_quick_branches_run_in_the_coordinators_pass_and_slow_ones_are_handed_on_to_the_fleet(durable) -> None:
    """A narrow fan-out runs in the pass that dispatched it (``InlineBranches``):
    eight quick branches cost no task at all; of four slow ones, the pass runs
    the first and hands the other three on as tasks, and they overlap."""
    tasks: Counter[str] = Counter()

    def counted(sender: Any = None, kwargs: Any = None, **_: Any) -> None:
        if getattr(sender, "name", None) == BRANCH_TASK:
            tasks[kwargs["call"]] += 1

    task_prerun.connect(counted, weak=False)
    try:
        # A quick branch is one step's round trip: 20 ms (the default) is more
        # than that on a quiet machine, but a loaded 2-core one (the full
        # suite's) has stalled one past it and handed the other seven on.
        # 250 ms keeps every quick branch in the pass there too, and still
        # hands the slow ones (0.6 s each) on well before the first ends.
        d = durable([quick_then_slow_wf], concurrency=8, branch_batch_ms=250)
        started = time.monotonic()
        envelope = d.client.run_workflow("quick-then-slow", timeout=TIMEOUT)
        wall = time.monotonic() - started
    finally:
        task_prerun.disconnect(counted)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [*range(8), *range(4)]
    assert tasks == Counter({"m:1": 3}), tasks
    assert wall < 4 * 0.6, f"four slow branches did not overlap: {wall:.2f}s"


@workflow(name="fanout-rules", description="fan-out argument checks", phases=[])
def fanout_rules_wf(ctx):
    out: dict[str, Any] = {"empty": ctx.parallel([]), "empty_pipeline": ctx.pipeline([], lambda p, item, i: p)}

    def producing(name: str):
        return lambda: ctx.step(name, lambda: count(name))

    try:
        ctx.parallel([producing(f"over-{i}") for i in range(5)])
    except ValueError as exc:
        out["too_many"] = str(exc)
    try:
        ctx.pipeline(list(range(5)), lambda prev, item, i: count(f"stage-{item}"))
    except ValueError as exc:
        out["too_many_items"] = str(exc)
    try:
        ctx.parallel([producing("callable-sibling"), 42])
    except ValueError as exc:
        out["not_callable"] = str(exc)
    out["at_cap"] = ctx.parallel([producing(f"cap-{i}") for i in range(4)])
    return out


def test_parallel_refuses_bad_fanouts_before_any_thunk_runs(durable) -> None:
    d = durable([fanout_rules_wf], max_fanout=4)
    assert d.settings.max_fanout == 4
    envelope = d.client.run_workflow("fanout-rules", timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    result = envelope.result
    assert result["empty"] == []
    assert result["empty_pipeline"] == []
    assert "4" in result["too_many"] and "5" in result["too_many"]
    assert "too_many_items" in result
    assert "not_callable" in result
    assert result["at_cap"] == [1, 1, 1, 1]
    with _LOCK:
        ran = {name for name, n in CALLS.items() if n}
    assert ran == {f"cap-{i}" for i in range(4)}


@workflow(name="pipe", description="pipelines", phases=[])
def pipe_wf(ctx):
    simple = ctx.pipeline([1, 2], lambda prev, item, i: prev * 2, lambda prev, item, i: prev + 1)

    def first(prev: Any, item: Any, i: int) -> Any:
        count(f"first-{item}")
        if item == "b":
            raise Boom("bad item")
        return ctx.step(f"first-{item}", lambda: f"{prev}{i}")

    def second(prev: Any, item: Any, i: int) -> Any:
        count(f"second-{item}")
        return [prev, item, i]

    partial = ctx.pipeline(["a", "b", "c"], first, second)
    return {"simple": simple, "partial": partial}


@pytest.mark.topologies("redis", "rabbitmq")
def test_pipeline_chains_stages_and_a_failing_stage_skips_only_that_item(durable) -> None:
    d = durable([pipe_wf])
    envelope = d.client.run_workflow("pipe", timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert envelope.result["simple"] == [3, 5]
    assert envelope.result["partial"] == [["a0", "a", 0], None, ["c2", "c", 2]]
    assert [calls(f"first-{item}") for item in "abc"] == [1, 1, 1]
    assert [calls(f"second-{item}") for item in "abc"] == [1, 0, 1]


@workflow(name="nested", description="a parallel inside a parallel", phases=[])
def nested_wf(ctx):
    def inner(i: int) -> Any:
        return ctx.parallel(
            [
                lambda: ctx.step(f"inner-{i}-0", lambda: count(f"inner-{i}-0") and i * 10),
                lambda: ctx.step(f"inner-{i}-1", lambda: count(f"inner-{i}-1") and i * 10 + 1),
            ]
        )

    return ctx.parallel([lambda: inner(0), lambda: inner(1), lambda: "leaf"])


@pytest.mark.topologies("redis", "rabbitmq")
def test_a_parallel_thunk_can_fan_out_again(durable) -> None:
    d = durable([nested_wf])
    envelope = d.client.run_workflow("nested", timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert envelope.result == [[0, 1], [10, 11], "leaf"]
    assert all(calls(f"inner-{i}-{j}") == 1 for i in range(2) for j in range(2))


# -- replay-safe values and helpers ----------------------------------------------


@workflow(name="helpers", description="now, uuid4, idempotency keys", phases=[])
def helpers_wf(ctx):
    now = ctx.now()
    ident = ctx.uuid4()
    record(("before", now, ident))
    ctx.parallel([lambda: 1])  # sent as a task (branch_batch_ms 0): the body is replayed in a later pass
    record(("after", now, ident))
    try:
        ctx.workflow("child")
    except NotImplementedError as exc:
        nested = [type(exc).__name__, str(exc)]
    later = ctx.now()
    return {
        "now": now.isoformat(),
        "uuid": str(ident),
        "later": later.isoformat(),
        "key": ctx.idempotency_key("x"),
        "nested": nested,
    }


def test_now_and_uuid4_are_stable_across_replays_and_helpers_behave(durable) -> None:
    d = durable([helpers_wf], branch_batch_ms=0)
    envelope = d.client.run_workflow("helpers", timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    result = envelope.result
    befores = [(now, ident) for kind, now, ident in RECORDS if kind == "before"]
    afters = [(now, ident) for kind, now, ident in RECORDS if kind == "after"]
    assert len(befores) >= 2 and afters, RECORDS
    assert len(set(befores + afters)) == 1, RECORDS
    now, ident = afters[-1]
    assert now.tzinfo is not None and now.utcoffset() == timedelta(0)
    assert now.isoformat() == result["now"]
    assert str(ident) == result["uuid"] and ident.version == 4
    assert envelope.created_at is not None
    assert abs(now - envelope.created_at) < timedelta(seconds=30)
    assert now.astimezone(UTC) <= envelope.finished_at
    assert result["later"] >= result["now"]
    assert result["key"] == f"{envelope.run_id}:x"
    assert result["nested"] == ["NotImplementedError", "Nested workflows are not supported"]


# -- progress -------------------------------------------------------------------------


@workflow(
    name="progress",
    description="phases and logs",
    phases=[{"title": "Fetch", "detail": "get rows"}, {"title": "Write"}],
)
def progress_wf(ctx):
    ctx.phase("Fetch")
    ctx.log("fetching rows")

    def branch() -> int:
        ctx.log("inside the branch")
        return ctx.step("fetch", lambda: 3)

    rows = ctx.parallel([branch])  # the main body above is replayed after this
    ctx.phase("Write")
    ctx.log(f"writing {rows[0]} rows")
    try:
        ctx.phase("Not declared")
    except WorkflowDefinitionError as exc:
        undeclared = str(exc)
    ctx.step("write", lambda: True)
    return {"undeclared": undeclared}


def test_phase_and_log_records_are_ordered_and_never_duplicated_by_replay(durable) -> None:
    d = durable([progress_wf])
    envelope = d.client.run_workflow("progress", timeout=TIMEOUT)
    assert envelope.status == "completed", envelope.error
    assert "Not declared" in envelope.result["undeclared"]

    page = d.client.get_workflow_run_progress(envelope.run_id)
    records = page.records
    seqs = [entry.seq for entry in records]
    assert seqs and seqs[0] == 1
    assert seqs == sorted(set(seqs))
    assert page.oldest_seq == 1 and page.newest_seq == seqs[-1]
    assert {entry.kind for entry in records} <= {"phase", "log", "system"}
    user = [(entry.kind, entry.message, entry.phase_id) for entry in records if entry.kind != "system"]
    assert user == [
        ("phase", "Fetch", "phase-1"),
        ("log", "fetching rows", "phase-1"),
        ("log", "inside the branch", "phase-1"),
        ("phase", "Write", "phase-2"),
        ("log", "writing 3 rows", "phase-2"),
    ]
    assert all(entry.attempt == 1 for entry in records)
    assert envelope.snapshot["phase"] == "Write"


def test_an_undeclared_phase_raises_workflow_definition_error(durable) -> None:
    wf = define_workflow(
        {"name": "undeclared", "description": "uses a phase it did not declare", "phases": [{"title": "Only"}]},
        lambda ctx: ctx.phase("Missing"),
    )
    d = durable([wf])
    envelope = d.client.run_workflow("undeclared", timeout=TIMEOUT)
    assert envelope.status == "error"
    assert envelope.reason == "exception"
    assert "WorkflowDefinitionError" in envelope.error
    assert "Missing" in envelope.error
