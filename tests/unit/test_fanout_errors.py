"""``errors=`` on ``ctx.parallel`` and ``ctx.pipeline`` (SPEC §4): ``"none"``
keeps the seed's None in a failed slot; ``"raise"`` lets every branch finish,
then raises the first failed slot's exception, so a saga around it
compensates; ``"return"`` puts the exception in the slot, the same on every
replay. In-process on the real scripts."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from celery_durable import ChildWorkflowFailed, StepFailed, WorkflowContext, workflow
from celery_durable.testing import Mechanisms, WorkflowTestEnvironment

ran: Counter[str] = Counter()


class Refused(Exception):
    """A type of the user's, from a module the worker has loaded: a slot gives it back."""


def count(key: str, value: Any) -> Any:
    ran[key] += 1
    return value


def fail(exc: BaseException) -> Any:
    raise exc


@workflow(name="err-kid", description="a child that fails", phases=[])
def failing_kid(ctx: WorkflowContext) -> Any:
    return ctx.step("kid-step", lambda: fail(RuntimeError("kid broke")))


def thunks(ctx: WorkflowContext) -> list[Any]:
    return [
        lambda: ctx.step("ok", lambda: count("ok", 1)),
        lambda: ctx.step("boom", lambda: fail(ZeroDivisionError("division by zero"))),
        lambda: fail(ValueError("bad thunk")),
        lambda: fail(Refused("no stock")),
        lambda: ctx.child("kid", failing_kid),
        lambda: ctx.step("last", lambda: count("last", 6)),
    ]


@workflow(name="err-return", description="errors='return', then a wait, then the slots as text", phases=[])
def returns(ctx: WorkflowContext) -> Any:
    slots = ctx.parallel(thunks(ctx), errors="return")
    ctx.wait_for_signal("go")  # the next pass replays the fan-out from the journal
    return [slot if not isinstance(slot, BaseException) else [type(slot).__name__, str(slot)] for slot in slots]


def test_return_puts_each_failure_in_its_slot_the_same_on_every_replay() -> None:
    seen: list[list[Any]] = []

    @workflow(name="err-return-seen", description="keeps what each pass saw", phases=[])
    def keeps(ctx: WorkflowContext) -> Any:
        slots = ctx.parallel(thunks(ctx), errors="return")
        seen.append(slots)
        ctx.wait_for_signal("go")
        return None

    env = WorkflowTestEnvironment([keeps, failing_kid])
    run_id = env.start(keeps)
    assert env.signal(run_id, "go").status == "completed"
    first, last = seen[0], seen[-1]
    assert len(seen) >= 2, "the fan-out was replayed after the wait"
    assert first[0] == 1 and first[5] == 6
    boom = first[1]
    assert isinstance(boom, StepFailed) and boom.key == "boom" and boom.error_type == "ZeroDivisionError"
    assert isinstance(first[2], ValueError) and str(first[2]) == "bad thunk"
    refused = first[3]
    assert type(refused) is Refused and str(refused) == "no stock"
    kid = first[4]
    assert isinstance(kid, ChildWorkflowFailed) and kid.key == "kid" and kid.child_status == "error"
    shape = [(type(slot).__name__, str(slot)) for slot in first]
    assert [(type(slot).__name__, str(slot)) for slot in last] == shape


def test_a_type_no_loaded_module_names_comes_back_as_step_failed_naming_it() -> None:
    class Local(Exception):  # its qualname has "<locals>": no module attribute leads to it
        pass

    @workflow(name="err-local", description="a thunk raising a type defined in a function", phases=[])
    def local(ctx: WorkflowContext) -> Any:
        (slot,) = ctx.parallel([lambda: fail(Local("gone"))], errors="return")
        assert isinstance(slot, StepFailed)
        return [slot.key, slot.error_type, slot.message]

    env = WorkflowTestEnvironment([local])
    run = env.run(local)
    assert run.status == "completed", run.error
    assert run.result == ["m:0/0", "Local", "gone"]  # keyed by the fan-out call and the slot


def test_a_slot_exception_is_built_with_the_arguments_it_was_raised_with() -> None:
    @workflow(name="err-args", description="thunks raising exceptions whose args are not their message", phases=[])
    def with_args(ctx: WorkflowContext) -> Any:
        slots = ctx.parallel(
            [lambda: fail(KeyError("k2")), lambda: fail(OSError(2, "No such file")), lambda: fail(Refused("a", 1))],
            errors="return",
        )
        ctx.wait_for_signal("go")  # the next pass gives the slots back from the journal
        return [[type(slot).__name__, str(slot), list(slot.args)] for slot in slots]

    env = WorkflowTestEnvironment([with_args])
    run = env.signal(env.start(with_args), "go")
    assert run.status == "completed", run.error
    assert run.result == [
        ["KeyError", "'k2'", ["k2"]],
        ["FileNotFoundError", "[Errno 2] No such file", [2, "No such file"]],
        ["Refused", "('a', 1)", ["a", 1]],
    ]


def test_raise_lets_every_branch_finish_then_raises_the_first_failure_and_a_saga_compensates() -> None:
    @workflow(name="err-raise", description="a saga around a fan-out that fails", phases=[])
    def raises(ctx: WorkflowContext) -> Any:
        with ctx.saga() as saga:
            saga.compensate("undo", lambda: count("undo", "undone"))
            ctx.parallel(
                [
                    lambda: ctx.step("a", lambda: count("a", 1)),
                    lambda: ctx.step("b", lambda: fail(KeyError("b"))),
                    lambda: ctx.step("c", lambda: fail(ValueError("c"))),
                    lambda: ctx.step("d", lambda: count("d", 4)),
                ],
                errors="raise",
            )
            ctx.step("next", lambda: count("next", "should not run"))
        return "unreached"

    ran.clear()
    env = WorkflowTestEnvironment([raises])
    run = env.run(raises)
    assert run.status == "error"
    assert "step 'b' raised KeyError" in (run.error or ""), run.error
    assert ran["a"] == 1 and ran["d"] == 1, "every branch finished first"
    assert ran["undo"] == 1 and ran["next"] == 0, "the saga compensated, the next step never ran"


def test_a_pipeline_item_that_fails_skips_its_later_stages_and_returns_the_failure() -> None:
    @workflow(name="err-pipe", description="a pipeline whose second item fails", phases=[])
    def piped(ctx: WorkflowContext) -> Any:
        def first(previous: Any, item: Any, index: int) -> Any:
            return ctx.step(f"first-{index}", lambda: fail(OSError("disk")) if item == 2 else item * 10)

        def second(previous: Any, item: Any, index: int) -> Any:
            return ctx.step(f"second-{index}", lambda: count(f"second-{index}", previous + 1))

        slots = ctx.pipeline([1, 2, 3], first, second, errors="return")
        return [slot if not isinstance(slot, BaseException) else type(slot).__name__ for slot in slots]

    ran.clear()
    env = WorkflowTestEnvironment([piped])
    assert env.run(piped).result == [11, "StepFailed", 31]
    assert "second-1" not in ran


def test_the_default_keeps_none_and_any_other_value_is_refused_before_a_branch_runs() -> None:
    @workflow(name="err-default", description="the seed's rule, and a bad errors=", phases=[])
    def default(ctx: WorkflowContext) -> Any:
        kept = ctx.parallel([lambda: 1, lambda: fail(ValueError("x"))])
        try:
            ctx.parallel([lambda: ctx.step("never", lambda: count("never", 1))], errors="ignore")
        except ValueError as exc:
            return [kept, str(exc)]
        return "accepted"

    ran.clear()
    env = WorkflowTestEnvironment([default])
    kept, message = env.run(default).result
    assert kept == [1, None]
    assert "errors must be one of 'none', 'raise', 'return'" in message and "'ignore'" in message
    assert ran["never"] == 0


@pytest.mark.parametrize("errors", ["raise", "return"])
def test_a_wide_fanout_of_branch_tasks_gives_the_same_slots(errors: str) -> None:
    """Wider than one task: branches journaled by branch tasks, read back by the pass."""

    @workflow(name=f"err-wide-{errors}", description="forty branches, one fails", phases=[])
    def wide(ctx: WorkflowContext) -> Any:
        try:
            slots = ctx.parallel(
                [lambda i=i: ctx.step(f"w{i}", lambda i=i: fail(KeyError(i)) if i == 17 else i) for i in range(40)],
                errors=errors,
            )
        except StepFailed as exc:
            return ["raised", exc.key]
        return [slot if not isinstance(slot, StepFailed) else [slot.key, slot.error_type] for slot in slots]

    env = WorkflowTestEnvironment([wide])
    result = env.run(wide).result
    if errors == "raise":
        assert result == ["raised", "w17"]
    else:
        assert result[17] == ["w17", "KeyError"] and result[16] == 16 and result[39] == 39



DAMAGE: dict[str, Any] = {}
"""The store whose journal the ``damaged`` workflow's step damages."""


@workflow(name="damaged", description="its journal damaged before its branch starts", phases=[])
def damaged(ctx: WorkflowContext) -> Any:
    ctx.step("a", lambda: 1)
    # A step's side effect, journaled before the branch message goes out.
    ctx.step("damage", lambda: damage(ctx.run_id))
    return ctx.parallel([lambda: ctx.step("b", lambda: count("damaged-branch", 2))])


def damage(run_id: str) -> None:
    store = DAMAGE["store"]
    store.client.hset(store.run_keys(run_id).journal, "v:a", b"o\xff\xfe not utf-8")


def test_a_branch_that_starts_on_a_damaged_journal_stops_the_run_as_corrupt_in_its_attempt() -> None:
    """A branch task reads the main body's sequence as it starts. Damaged
    there, it cannot start: it wakes the coordinator, whose pass meets the
    same damage and stops the run as workflow_storage_corrupt in the attempt
    that met it, not a lease later, as a new one, by the sweep."""
    env = WorkflowTestEnvironment([damaged], mechanisms=Mechanisms.MESSAGES)
    DAMAGE["store"] = env.engine.store
    envelope = env.run("damaged")
    assert (envelope.status, envelope.reason, envelope.attempt) == ("error", "workflow_storage_corrupt", 1)
    assert ran["damaged-branch"] == 0
