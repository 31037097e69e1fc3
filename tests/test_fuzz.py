"""Hostile input at every entry point, fuzzed with Hypothesis against a real
Redis and a real worker (SPEC §2, §3, §7, §12; the "bad input" issue).

For every call: it succeeds, or it raises a clear error — ``ValueError``,
``TypeError`` or a ``DurableError`` — with a non-empty message; a refused
call leaves every key of the test in Redis as it was; a canary run, held at
a step while the fuzzing goes on, completes afterwards, and so do the runs
that were accepted. Task messages sent straight to the worker are never
executed and never stop it.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery.signals import task_postrun
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from celery_durable import RunEnvelope, Workflow, WorkflowContext, define_workflow, workflow
from celery_durable.tasks.app import AGENT_TASK, BRANCH_TASK, CALL_FAILED_TASK, CALL_RESULT_TASK, COORDINATOR_TASK
from celery_durable.workflows.definition import META_KEYS, NAME_PATTERN
from tests.support.hostile import (
    PAYLOAD_BYTES,
    bad_numbers,
    json_values,
    junk,
    limits,
    names,
    payloads,
    refusal,
    run_ids,
    snapshot,
    text,
)
from tests.support.poll import RUN_BOUND, poll

TIMEOUT = 30
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
    # The same examples on every run, so CI is repeatable; to explore new
    # ones, run with derandomize off (and keep what they find as tests).
    derandomize=True,
    # No shrinking: against a live worker it can take minutes. The failing
    # example is reported as found.
    phases=[Phase.explicit, Phase.generate],
)
SEEN: set[str] = set()
"""Every distinct kind of error message the fuzzing met (printed with ``-s``)."""


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    print(f"\n{len(SEEN)} distinct error messages met by the fuzz tests:")
    for line in sorted(SEEN):
        print("  ", line)


class Gate:
    """Holds the canary's step until the test opens it."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def hold(self) -> str:
        self.entered.set()
        if not self.release.wait(TIMEOUT * 4):
            raise RuntimeError("the test never opened the gate")
        return "released"


GATE = Gate()


@pytest.fixture(autouse=True)
def gate() -> Iterator[Gate]:
    global GATE
    GATE = Gate()
    yield GATE
    GATE.release.set()  # before the worker stops


@workflow(name="canary", description="a healthy run held at a step", phases=[{"title": "Hold"}])
def canary(ctx: WorkflowContext) -> Any:
    ctx.phase("Hold")
    ctx.log("holding")
    return {"held": ctx.step("hold", lambda: GATE.hold())}


@workflow(name="echo", description="returns its args from a step", phases=[{"title": "Echo", "detail": "d"}])
def echo(ctx: WorkflowContext) -> Any:
    ctx.phase("Echo")
    return ctx.step("echo", lambda: ctx.args)


@workflow(
    name="strict",
    description="args checked by a schema",
    phases=[],
    args_schema={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
)
def strict(ctx: WorkflowContext) -> Any:
    return ctx.step("n", lambda: ctx.args["n"])


@workflow(name="flaky", description="fails its first attempt", phases=[])
def flaky(ctx: WorkflowContext) -> Any:
    if ctx.attempt == 1:
        ctx.step("boom", lambda: 1 / 0)
        raise RuntimeError("first attempt fails")
    return "second attempt"


UNREGISTERED = define_workflow({"name": "echo", "description": "same name, other code", "phases": []}, lambda c: 1)


def held_canary(d: Any, gate: Gate) -> str:
    run_id: str = d.client.start_workflow("canary")
    assert gate.entered.wait(TIMEOUT), "the canary never reached its step"
    return run_id


def quiet(d: Any, raw: Any, *keep: str) -> None:
    """Wait until the recovery schedule holds only ``keep``: settled runs have
    left it, and each run settled for good is archived (which follows its
    settle: a later call's snapshot must not see it land)."""
    due = d.engine.store.keys.sweep_due
    poll(
        lambda: set(raw.zrange(due, 0, -1)) <= set(keep) and not unarchived(d, raw),
        within=RUN_BOUND,
        what="settled runs to leave the sweep's schedule and be archived",
    )


def unarchived(d: Any, raw: Any) -> list[str]:
    """The completed or cancelled runs under the engine's prefix not archived yet."""
    found = []
    for key in raw.scan_iter(match=f"{d.settings.key_prefix}:{{*}}:run", count=1000):
        run_id = key.split("{", 1)[1].split("}", 1)[0]
        settled_for_good = raw.hget(key, "status") in ("completed", "cancelled")
        if settled_for_good and not raw.exists(d.engine.store.run_keys(run_id).archive):
            found.append(run_id)
    return found


def canary_completes(d: Any, gate: Gate, run_id: str) -> None:
    gate.release.set()
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert (envelope.status, envelope.result) == ("completed", {"held": "released"}), envelope.error


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


# -- definitions -------------------------------------------------------------------------

phases = st.lists(
    st.dictionaries(st.sampled_from(["title", "detail"]) | text, text | junk, max_size=3) | junk, max_size=4
)
meta_values: dict[str, st.SearchStrategy[Any]] = {
    "name": names | junk,
    "description": text | junk,
    "phases": phases | junk,
    "limits": limits | st.none(),
    "args_schema": st.dictionaries(st.sampled_from(["type", "properties", "required", "minimum"]), json_values)
    | json_values,
    "version": text | junk,
}
good_phases = st.lists(st.fixed_dictionaries({"title": text}, optional={"detail": text}), max_size=3)
metas = (
    st.fixed_dictionaries(
        {},
        optional={key: meta_values[key] for key in META_KEYS} | {"retries": junk, "\ud800": junk},
    )
    # Mostly valid meta with one part fuzzed, so the checks past the first one are reached.
    | st.fixed_dictionaries(
        {"name": names, "description": text | st.just("d"), "phases": good_phases | phases},
        optional={"limits": meta_values["limits"], "args_schema": meta_values["args_schema"]},
    )
    | junk
)


@FUZZ
@given(meta=metas, run=st.sampled_from([lambda ctx: None, None, 5, "run"]))
def test_define_workflow_accepts_or_refuses_clearly(meta: Any, run: Any) -> None:
    outcome = refusal(lambda: define_workflow(meta, run), SEEN)
    if isinstance(outcome, Workflow):
        assert NAME_PATTERN.fullmatch(outcome.name)
        assert outcome.description.strip()
        assert len({phase.title for phase in outcome.phases}) == len(outcome.phases)
        assert outcome.run is run


@FUZZ
@given(
    kwargs=st.dictionaries(
        st.sampled_from(["name", "description", "phases", "limits", "args_schema", "version", "x"]), junk
    )
)
def test_the_workflow_decorator_accepts_or_refuses_clearly(kwargs: dict[str, Any]) -> None:
    refusal(lambda: workflow(**kwargs)(lambda ctx: None), SEEN)


# -- client calls --------------------------------------------------------------------------


@dataclass
class World:
    """An engine with a worker, a held canary, and runs of another namespace."""

    d: Any
    raw: Any
    gate: Gate
    canary_id: str
    foreign: list[RunEnvelope]

    @property
    def foreign_ids(self) -> list[str]:
        return [envelope.run_id for envelope in self.foreign]

    def unchanged(self, call: Callable[[], Any], **options: Any) -> Any:
        """``refusal(call)``, and a refused call must not have written anything."""
        before = snapshot(self.raw, self.d.settings.key_prefix)
        outcome = refusal(call, SEEN, **options)
        if isinstance(outcome, BaseException):
            assert snapshot(self.raw, self.d.settings.key_prefix) == before, f"a refused call wrote: {outcome!r}"
        return outcome

    def healthy(self) -> None:
        """The other namespace's runs are as they were, and the canary completes."""
        other = self.d.engine.client("other")
        for envelope in self.foreign:
            assert other.get_workflow_run(envelope.run_id) == envelope
        canary_completes(self.d, self.gate, self.canary_id)

    def known_ids(self) -> st.SearchStrategy[Any]:
        """Ids that are not this namespace's: junk, near misses and the other namespace's runs."""
        return run_ids(self.canary_id, *self.foreign_ids) | st.sampled_from(self.foreign_ids)


@pytest.fixture
def world(durable, raw_redis, gate) -> World:
    d = durable([canary, echo, strict, flaky], max_payload_bytes=PAYLOAD_BYTES)
    other = d.engine.client("other")
    foreign_error = other.run_workflow("flaky", timeout=TIMEOUT)
    foreign_done = other.run_workflow("echo", args={"x": 1}, timeout=TIMEOUT)
    assert (foreign_error.status, foreign_error.can_resume, foreign_done.status) == ("error", True, "completed")
    canary_id = held_canary(d, gate)
    quiet(d, raw_redis, canary_id)
    return World(d, raw_redis, gate, canary_id, [foreign_error, foreign_done])


def test_starts_succeed_or_refuse_clearly_and_refusals_write_nothing(world: World) -> None:
    d = world.d
    accepted: list[str] = []

    @FUZZ
    @given(
        name=st.sampled_from(["echo", "strict", echo]) | st.sampled_from(["echo", UNREGISTERED]) | names | junk,
        args=payloads | st.none() | st.fixed_dictionaries({"n": payloads}),
        run_limits=st.none() | st.none() | limits,
        key=st.none() | st.none() | text | st.just("k" * 257) | junk,
    )
    def starts(name: Any, args: Any, run_limits: Any, key: Any) -> None:
        outcome = world.unchanged(
            lambda: d.client.start_workflow(name, args=args, limits=run_limits, idempotency_key=key)
        )
        if isinstance(outcome, str):
            accepted.append(outcome)
            envelope = d.client.wait_for_workflow_run(outcome, timeout=TIMEOUT)
            if envelope.status != "completed":
                assert envelope.reason == "workflow_limit_reached", envelope.error  # e.g. timeout_seconds=1e-300
            quiet(d, world.raw, world.canary_id)

    starts()
    assert accepted, "no start was accepted: the strategies only made bad input"
    world.healthy()


def test_run_workflow_refuses_a_bad_timeout_before_it_starts_a_run(world: World) -> None:
    """run_workflow checks its wait's timeout before the start, as
    resume_workflow does: refused after it, the call raised with a run
    started whose id the caller never got."""
    d = world.d

    @FUZZ
    @given(timeout=bad_numbers.filter(lambda v: v is not None and not (_positive(v) and v <= 1e9)))
    def runs(timeout: Any) -> None:
        outcome = world.unchanged(lambda: d.client.run_workflow("echo", args={"n": 1}, timeout=timeout))
        assert isinstance(outcome, ValueError), outcome
        assert "timeout" in str(outcome)

    runs()
    world.healthy()


@pytest.mark.parametrize(
    ("option", "call"),
    [
        ("idempotency_key", lambda c: c.start_workflow("echo", idempotency_key="k\ud800")),
        ("throttle_key", lambda c: c.start_workflow("echo", throttle="t", throttle_key="\udfff")),
        ("note", lambda c: c.create_schedule("s", workflow="echo", every=60, note="\ud800")),
        ("note", lambda c: c.update_schedule("s", note="\ud800")),
        ("note", lambda c: c.pause_schedule("s", note="\ud800")),
        ("note", lambda c: c.unpause_schedule("s", note="\ud800")),
    ],
)
def test_a_string_redis_cannot_store_is_refused_naming_its_option(world: World, option: str, call: Any) -> None:
    """A lone surrogate cannot be encoded as UTF-8, so Redis never sees it:
    the option is refused by name, before anything is written. Before, these
    raised the encoder's own UnicodeEncodeError, which names no option, and a
    throttle key got as far as the sweep's list of throttles."""
    d = world.d
    d.client.create_schedule("s", workflow="echo", every=3600, paused=True)
    quiet(d, world.raw, world.canary_id)
    outcome = world.unchanged(lambda: call(d.client))
    assert isinstance(outcome, ValueError) and not isinstance(outcome, UnicodeError), repr(outcome)
    assert str(outcome).startswith(f"{option} holds a lone surrogate"), str(outcome)
    world.healthy()


def test_reads_succeed_or_refuse_clearly_and_write_nothing(world: World) -> None:
    d = world.d
    # Timeouts short enough for a wait on the held canary, or not timeouts at
    # all -- but never None, which is a valid "wait for ever" on a held run.
    waits = st.floats(min_value=1e-6, max_value=0.05) | bad_numbers.filter(lambda v: v is not None and not _positive(v))
    cancel_events = st.none() | junk | st.builds(lambda: (event := threading.Event(), event.set())[0])

    @FUZZ
    @given(
        run_id=world.known_ids() | st.just(world.canary_id),
        phase_id=st.none() | text | st.sampled_from(["phase-1", "phase-2"]) | junk,
        after=st.none() | st.none() | bad_numbers,
        before=st.none() | st.none() | bad_numbers,
        limit=st.none() | st.none() | bad_numbers,
        timeout=waits,
        poll_ms=st.none() | st.none() | bad_numbers,
        cancel_event=cancel_events,
    )
    def reads(
        run_id: Any, phase_id: Any, after: Any, before: Any, limit: Any, timeout: Any, poll_ms: Any, cancel_event: Any
    ) -> None:
        world.unchanged(lambda: d.client.get_workflow_run(run_id))
        world.unchanged(lambda: d.client.get_workflow_run_detail(run_id))
        world.unchanged(
            lambda: d.client.get_workflow_run_progress(
                run_id, phase_id=phase_id, after_seq=after, before_seq=before, limit=limit
            )
        )
        # A wait on the held canary ends by its (tiny) timeout or its cancel event.
        world.unchanged(
            lambda: d.client.wait_for_workflow_run(
                run_id, timeout=timeout, poll_interval_ms=poll_ms, cancel_event=cancel_event
            ),
            also=(TimeoutError,),
        )
        follow = world.unchanged(
            lambda: d.client.follow_workflow_run_progress(
                run_id, phase_id=phase_id, after_seq=after, timeout=timeout, poll_interval_ms=poll_ms
            )
        )
        if isinstance(follow, Iterator):
            follow.close()  # it checked its options; iterating it would wait for the canary
        watch = world.unchanged(lambda: d.client.watch_runs(run_ids=run_id))
        if not isinstance(watch, BaseException):
            watch.close()

    reads()
    world.healthy()


def test_listings_and_clients_succeed_or_refuse_clearly(world: World) -> None:
    d = world.d

    @FUZZ
    @given(
        status=st.none() | st.none() | text | st.sampled_from(["running", "completed", "RUNNING"]) | junk,
        name=st.none() | st.none() | names | junk,
        limit=st.integers(1, 500) | bad_numbers,
        cursor=st.none() | text | st.sampled_from(["s1", "s", "s²", "s" + "9" * 400, "s-1", "s1.5"]) | junk,
        namespace=st.none() | names | junk,
    )
    def listings(status: Any, name: Any, limit: Any, cursor: Any, namespace: Any) -> None:
        page = world.unchanged(
            lambda: d.client.list_workflow_runs(status=status, workflow=name, limit=limit, cursor=cursor)
        )
        if not isinstance(page, BaseException):
            assert not {run.run_id for run in page.runs} & set(world.foreign_ids), "another namespace's runs listed"
        client = world.unchanged(lambda: d.engine.client(namespace))
        if not isinstance(client, BaseException):
            assert client.namespace in (namespace, d.settings.namespace)

    listings()
    world.healthy()


def test_changes_to_runs_that_are_not_ours_are_refused_and_write_nothing(world: World) -> None:
    d = world.d

    @FUZZ
    @given(
        run_id=world.known_ids(),
        timeout=st.none() | st.none() | bad_numbers,
        run_limits=st.none() | st.none() | limits,
        force=st.booleans() | junk,
        allow=st.booleans() | junk,
        signal=text | junk,
        payload=payloads,
    )
    def changes(run_id: Any, timeout: Any, run_limits: Any, force: Any, allow: Any, signal: Any, payload: Any) -> None:
        calls: list[Callable[[], Any]] = [
            lambda: d.client.cancel_workflow_run(run_id, timeout=timeout),
            lambda: d.client.pause_workflow_run(run_id, timeout=timeout),
            lambda: d.client.resume_workflow(
                run_id, limits=run_limits, timeout=timeout, force=force, allow_code_change=allow
            ),
        ]
        if run_id is not None:  # None would start a new run, not resume one
            calls.append(
                lambda: d.client.run_workflow("echo", limits=run_limits, resume_from_run_id=run_id, timeout=timeout)
            )
        if hasattr(d.client, "signal_workflow_run"):
            calls.append(lambda: d.client.signal_workflow_run(run_id, signal, payload))
        for call in calls:
            outcome = world.unchanged(call)
            assert isinstance(outcome, BaseException), "a call on a run that is not this namespace's succeeded"

    changes()
    world.healthy()


# -- task messages -----------------------------------------------------------------------------


@pytest.fixture
def finished() -> Iterator[list[str]]:
    """Ids of every task that returned in this process (in-process workers)."""
    done: list[str] = []

    def on_postrun(task_id: str | None = None, **_: Any) -> None:
        if task_id:
            done.append(task_id)

    task_postrun.connect(on_postrun, weak=False)
    yield done
    task_postrun.disconnect(on_postrun)


def kombu_frame(queue: str, body: bytes, content_type: str, task: str = COORDINATOR_TASK) -> str:
    """A frame as kombu's Redis transport stores it, with any body and content type."""
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": content_type,
            "headers": {"task": task, "id": uuid.uuid4().hex, "lang": "py", "argsrepr": "", "kwargsrepr": ""},
            "properties": {
                "delivery_tag": uuid.uuid4().hex,
                "body_encoding": "base64",
                "delivery_info": {"exchange": queue, "routing_key": queue},
                "priority": 0,
            },
        }
    )


def would_run(canary_id: str, args: list[Any], kwargs: dict[str, Any]) -> bool:
    """True for the canary's own coordinator message: valid, so not fuzz
    (fields a pass does not know are ignored: a later version's)."""
    names = ("run_id", "epoch", "workflow")
    bound = dict(zip(names, args, strict=False))
    if len(args) > len(names) or set(bound) & set(kwargs):
        return False
    bound.update(kwargs)
    return {name: bound.get(name) for name in names} == {"run_id": canary_id, "epoch": 1, "workflow": "canary"}


def test_task_messages_are_rejected_never_executed_and_never_stop_the_worker(
    durable, raw_redis, gate, finished, caplog
) -> None:
    caplog.set_level(logging.INFO)
    d = durable([canary, echo, flaky], concurrency=4)
    app = d.engine.celery
    prefix = d.settings.key_prefix
    foreign = d.engine.client("other").run_workflow("flaky", timeout=TIMEOUT)
    canary_id = held_canary(d, gate)
    quiet(d, raw_redis, canary_id)
    queues = [d.settings.coordinator_queue, d.settings.steps_queue, d.settings.agents_queue]
    before = snapshot(raw_redis, prefix)
    refused_before = d.engine.refused_messages

    def sentinel(queue: str) -> str:
        """A rejected message behind everything sent so far to ``queue``; frames of
        one queue are consumed in order, so once it has run they all were."""
        return str(app.send_task(COORDINATOR_TASK, kwargs={"run_id": "sentinel"}, queue=queue).id)

    values = (
        json_values
        | st.sampled_from([canary_id, foreign.run_id, uuid.uuid4().hex, 1, 2, "canary", "echo", "flaky", "trip"])
        | st.sampled_from(["m:0", "m.0.1:2", "m:99", "m", "a" * 32, "0" * 32, "m:0/1"])
        | st.lists(st.integers(-2, 5) | st.booleans() | st.none() | text, max_size=4)
    )
    fields = st.sampled_from(["run_id", "epoch", "workflow", "call", "branches", "agent", "owner"]) | text
    # Near misses: the shape of a real message of each task, with fields wrong.
    base = {
        "run_id": st.sampled_from([canary_id, foreign.run_id, uuid.uuid4().hex]),
        "epoch": st.sampled_from([1, 2, 1001]) | st.integers(),
        "workflow": st.sampled_from(["canary", "echo", "flaky", "trip"]),
    }
    near = st.one_of(
        st.tuples(st.just(COORDINATOR_TASK), st.fixed_dictionaries(base)),
        st.tuples(
            st.just(BRANCH_TASK),
            st.fixed_dictionaries(
                {
                    **base,
                    "call": st.sampled_from(["m:0", "m:1", "m.0.1:0"]),
                    "branches": st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),
                }
            ),
        ),
        st.tuples(
            st.just(AGENT_TASK),
            st.fixed_dictionaries(
                {**base, "agent": st.sampled_from(["a" * 32, uuid.uuid4().hex]), "owner": st.just("m")}
            ),
        ),
    )
    fuzzed = st.tuples(
        st.sampled_from([COORDINATOR_TASK, BRANCH_TASK, AGENT_TASK]), st.dictionaries(fields, values, max_size=7)
    )

    @FUZZ
    @given(
        message=near | fuzzed,
        queue=st.sampled_from(queues),
        args=st.just([]) | st.just([]) | st.lists(values, max_size=5),
    )
    def messages(message: tuple[str, dict[str, Any]], queue: str, args: list[Any]) -> None:
        task, kwargs = message
        if task == COORDINATOR_TASK and would_run(canary_id, args, kwargs):
            return
        sent = str(app.send_task(task, args=args, kwargs=kwargs, queue=queue).id)
        poll(lambda: sent in finished, within=RUN_BOUND, what="the message to be handled")
        assert snapshot(raw_redis, prefix) == before, f"a fuzzed message wrote: {task} {args!r:.200} {kwargs!r:.200}"

    messages()

    def envelope(body: bytes, content_type: str, task: str = COORDINATOR_TASK) -> Callable[[str], str]:
        return lambda queue: kombu_frame(queue, body, content_type, task)

    @FUZZ
    @given(
        queue=st.sampled_from(queues),
        frame=st.one_of(
            st.binary(max_size=64).map(lambda b: lambda _q: b.decode("latin-1")),
            json_values.map(lambda v: lambda _q: json.dumps(v)),
            st.builds(envelope, st.binary(max_size=32), st.just("application/json")),
            st.builds(
                envelope,
                st.just(b"\x80\x04K\x01."),
                st.sampled_from(["application/x-python-serialize", "application/x-yaml", "text/plain"]),
            ),
            st.builds(envelope, st.just(b"[[], {}, {}]"), st.just("application/json"), names),
        ),
    )
    def frames(queue: str, frame: Callable[[str], str]) -> None:
        raw_redis.lpush(queue, frame(queue))
        mark = sentinel(queue)
        poll(lambda: mark in finished, within=RUN_BOUND, what="the frame to be consumed")
        assert snapshot(raw_redis, prefix) == before, f"a fuzzed frame wrote: {frame(queue)!r:.200}"

    frames()

    # Nothing ran: the canary is still held at its one step, and it completes.
    assert d.engine.refused_messages > refused_before, "no forged message reached the fence check"
    logged = [r for r in caplog.records if r.name.startswith("celery_durable") and r.levelno >= logging.INFO]
    assert any("rejected" in r.getMessage() for r in logged)
    assert any("refused stale or forged" in r.getMessage() for r in logged)
    assert not any(r.name == "celery.worker" and "Unrecoverable" in r.getMessage() for r in caplog.records)
    canary_completes(d, gate, canary_id)
    assert d.client.run_workflow("echo", args={"after": "fuzz"}, timeout=TIMEOUT).result == {"after": "fuzz"}


REJECTED = "rejected celery_durable.coordinator message "
NOT_A_BODY = "the body is not [args, kwargs, options]"


@pytest.mark.parametrize(
    ("task", "body", "headers", "logged"),
    [
        (COORDINATOR_TASK, b'{"args": 1}', {}, f"{NOT_A_BODY}: {{'args': 1}}"),
        (COORDINATOR_TASK, b'"text"', {}, f"{NOT_A_BODY}: 'text'"),
        (COORDINATOR_TASK, b"[[], {}]", {}, f"{NOT_A_BODY}: [[], {{}}]"),
        (COORDINATOR_TASK, b'[[], {}, "options"]', {}, NOT_A_BODY),
        (COORDINATOR_TASK, b"[[], [], {}]", {}, NOT_A_BODY),
        (COORDINATOR_TASK, b"[[], {}, {}]", {"timelimit": "x"}, "not a task message Celery can read: ValueError"),
        # One of Celery's own tasks, registered on every app: Celery's strategy.
        ("celery.backend_cleanup", b'{"a": 1}', {}, "dropped a broker frame that is not a task message"),
    ],
    ids=["object", "string", "two-items", "options-not-an-object", "kwargs-not-an-object", "bad-header", "celery-task"],
)
def test_a_json_message_celery_cannot_read_is_rejected_and_gives_its_slot_back(
    durable, raw_redis, caplog, task: str, body: bytes, headers: dict[str, Any], logged: str
) -> None:
    """A JSON body that is not a task's, or a header Celery cannot read,
    made Celery's strategy raise past its consumer with the message never
    acknowledged: each held one of the worker's prefetch slots for good, and
    a few more than its concurrency left it taking no message at all (the
    broker would hand them out again after the visibility timeout, to stop
    the next worker). Each is refused naming what is wrong, and runs go on."""
    caplog.set_level(logging.INFO, logger="celery_durable")
    d = durable([echo], concurrency=2)  # two prefetch slots
    queue = d.settings.coordinator_queue
    for _ in range(3):
        frame = json.loads(kombu_frame(queue, body, "application/json", task))
        frame["headers"].update(headers)
        raw_redis.lpush(queue, json.dumps(frame))
    envelope = d.client.run_workflow("echo", args={"after": "junk"}, timeout=TIMEOUT)
    assert (envelope.status, envelope.result) == ("completed", {"after": "junk"}), envelope.error
    poll(
        lambda: len([r for r in caplog.records if logged in r.getMessage()]) == 3,
        within=RUN_BOUND,
        what="each message to be rejected, naming why",
    )
    if task == COORDINATOR_TASK:
        assert all(REJECTED in r.getMessage() for r in caplog.records if logged in r.getMessage())
    # kombu's Redis transport keeps every unacknowledged message in one hash, with its queue.
    held = lambda: [m for m in raw_redis.hvals("unacked") if json.loads(m)[-1] == queue]  # noqa: E731
    poll(lambda: not held(), within=RUN_BOUND, what="no message of the queue left unacknowledged")


@workflow(name="caller", description="waits at a call nobody serves", phases=[])
def caller(ctx: WorkflowContext) -> Any:
    return ctx.call("render", "gpu.render", args=("x",), queue=ctx.args["queue"])


def _without_refusal_counts(state: dict[str, Any]) -> dict[str, Any]:
    """A snapshot less each run's count of refused writes, which a refused answer adds to."""
    return {
        key: {k: v for k, v in value.items() if k != "refused"} if key.endswith(":run") else value
        for key, value in state.items()
    }


def test_call_answers_that_are_not_the_runs_are_refused_named_and_the_waiting_run_completes(
    durable, raw_redis, finished, caplog
) -> None:
    """``call_result`` and ``call_failed`` are messages too: each bad one is
    refused with a line that names what is wrong, writes nothing, and the
    worker goes on serving; the run waiting at its call takes the real answer
    after them, and a second delivery of that answer changes nothing. Before,
    a key Redis cannot store (a lone surrogate) died in the worker as an
    unexpected error, and an answer naming no run raised "Run record ... is
    missing", a storage corruption that was not one."""
    caplog.set_level(logging.INFO, logger="celery_durable")
    d = durable([caller, echo], concurrency=4)
    prefix = d.settings.key_prefix
    queue = d.settings.coordinator_queue
    foreign = d.engine.client("other").run_workflow("echo", args={"x": 1}, timeout=TIMEOUT)
    run_id = d.client.start_workflow("caller", args={"queue": f"{prefix}.gpu"})
    poll(lambda: raw_redis.llen(f"{prefix}.gpu") == 1, within=RUN_BOUND, what="the call to be sent")
    fields = {"run_id": run_id, "epoch": 1, "workflow": "caller", "key": "render", "task_name": "gpu.render"}
    result, failed = CALL_RESULT_TASK, CALL_FAILED_TASK
    cases: list[tuple[str, list[Any], dict[str, Any], str]] = [
        (result, ["v"], {**fields, "key": "\ud800"}, "rejected call result message: key is not a call key"),
        (failed, ["tid"], {**fields, "key": "\udfff"}, "rejected call error message: key is not a call key"),
        (result, ["v"], {**fields, "key": "k" * 1025}, "rejected call result message: key is not a call key"),
        (result, ["v"], {**fields, "key": ["render"]}, "rejected call result message: key is not a call key"),
        (failed, ["tid"], {**fields, "task_name": "\ud800"}, "rejected call error message: task is not a task"),
        (result, ["v"], {**fields, "run_id": uuid.uuid4().hex}, "refused stale or forged call answer for run"),
        (result, ["v"], {**fields, "run_id": foreign.run_id}, "refused stale or forged call answer for run"),
        (result, ["v"], {**fields, "run_id": "../x"}, "rejected call result message: run_id is not a run id"),
        (result, ["v"], {**fields, "epoch": 2}, "refused stale or forged call answer for run"),
        (result, ["v"], {**fields, "epoch": "1"}, "rejected call result message: epoch is not a positive integer"),
        (result, ["v"], {**fields, "key": "never-called"}, "refused stale or forged call answer for run"),
        (result, [], fields, "rejected call result message: expected the task's result as the one positional"),
        (result, ["v", "w"], fields, "rejected call result message: expected the task's result as the one"),
        (failed, [1, 2, 3], fields, f"rejected call error message for run {run_id}: unexpected arguments"),
        (failed, [{"id": "tid"}], fields, f"rejected call error message for run {run_id}: unexpected arguments"),
    ]
    before = _without_refusal_counts(snapshot(raw_redis, prefix))
    for task, args, kwargs, logged in cases:
        frame = kombu_frame(queue, json.dumps([args, kwargs, {}]).encode(), "application/json", task)
        sent = json.loads(frame)["headers"]["id"]
        case = f"{task} {args!r:.40} {kwargs!r:.120}"
        caplog.clear()
        raw_redis.lpush(queue, frame)
        poll(lambda sent=sent: sent in finished, within=RUN_BOUND, what=f"{case} to be handled")
        lines = [r.getMessage() for r in caplog.records]
        assert any(logged in line for line in lines), f"{case}: {lines}"
        assert not [r for r in caplog.records if r.exc_info], f"{case}: a traceback for a bad message: {lines}"
        assert _without_refusal_counts(snapshot(raw_redis, prefix)) == before, f"{case} wrote"
    # The real answer, then the same again: the second changes nothing.
    answer = kombu_frame(queue, json.dumps([["done"], fields, {}]).encode(), "application/json", result)
    raw_redis.lpush(queue, answer)
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert (envelope.status, envelope.result) == ("completed", "done"), envelope.error
    quiet(d, raw_redis)
    settled = _without_refusal_counts(snapshot(raw_redis, prefix))
    again = json.loads(answer)
    again["headers"]["id"] = uuid.uuid4().hex
    raw_redis.lpush(queue, json.dumps(again))
    poll(lambda: again["headers"]["id"] in finished, within=RUN_BOUND, what="the second delivery handled")
    assert _without_refusal_counts(snapshot(raw_redis, prefix)) == settled
    assert d.client.run_workflow("echo", args={"after": "answers"}, timeout=TIMEOUT).result == {"after": "answers"}


@workflow(name="held-fan", description="a fan-out whose first branch the test holds", phases=[])
def held_fan(ctx: WorkflowContext) -> Any:
    return ctx.parallel([lambda: ctx.step("held", lambda: GATE.hold()), lambda: ctx.step("quick", lambda: "quick")])


def test_a_branch_message_copied_from_flower_with_other_branches_is_refused_and_the_run_completes(
    durable, gate, caplog
) -> None:
    """Flower shows a branch task's id and arguments: the same id sent again
    naming a branch past the fan-out's width once failed the real branch as
    nondeterministic, for good (issue 25 item 10). It is refused, logged, and
    the run completes as it would have."""
    caplog.set_level(logging.WARNING, logger="celery_durable")
    d = durable([held_fan], branch_batch_ms=0)  # each branch its own task on the steps queue
    run_id = d.client.start_workflow("held-fan")
    assert gate.entered.wait(TIMEOUT), "the held branch never started"
    store = d.engine.store
    live = store.client.hgetall(store.run_keys(run_id).live)
    running = next(task for task, value in live.items() if value.startswith("x|") and task != "")
    refused = d.engine.refused_messages
    d.engine.send_branches(run_id, 1, "held-fan", "m:0", [0, 2], task_ids=[running])
    poll(
        lambda: d.engine.refused_messages > refused,
        within=RUN_BOUND,
        what="the forged branch message to be refused",
    )
    gate.release.set()
    envelope = d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    assert (envelope.status, envelope.result) == ("completed", ["released", "quick"])
    assert any("refused stale or forged branch message" in r.getMessage() for r in caplog.records)
