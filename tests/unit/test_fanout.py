"""Fan-out bookkeeping: a fan-out suspends the pass and sends its branches;
branch tasks journal outcomes and the last one out wakes the coordinator,
whose next pass collects; ordinary failures fill a slot with None, fatal ones
abort the whole call; nested fan-outs run in threads inside their branch."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from celery_durable import WorkflowCancelled, WorkflowContext, workflow
from celery_durable.broker import schema
from celery_durable.broker.journal import PendingCommit
from celery_durable.workflows.branch_work import BranchWork
from tests.unit.harness import Driver

calls: Counter[str] = Counter()


def produce(key: str, value: Any) -> Any:
    calls[key] += 1
    return value


@workflow(name="fan", description="Three branches, each one step", phases=[])
def fan(ctx: WorkflowContext) -> Any:
    first = ctx.step("before", lambda: produce("before", "x"))
    results = ctx.parallel([lambda i=i: ctx.step(f"b{i}", lambda i=i: produce(f"b{i}", i * 10)) for i in range(3)])
    return [first, *results]


def test_a_fanout_journals_its_op_sends_its_branches_and_suspends_the_pass() -> None:
    calls.clear()
    driver = Driver.of(fan)
    assert driver.main() is None
    assert driver.branches == [("m:1", 0), ("m:1", 1), ("m:1", 2)]
    journal = driver.state.journal
    assert (journal["c:m:1"], journal["d:m:1"], journal["s:m:1"]) == ("3", "1:execution-1", "1")
    assert driver.journal().read_sequence("m").live_entries() == [("s|before", 'o"x"'), ("p|3", None)]
    assert driver.record().status == "running"
    assert calls == Counter({"before": 1})


def test_the_last_branch_out_wakes_the_coordinator_whose_pass_collects_in_order() -> None:
    calls.clear()
    driver = Driver.of(fan)
    driver.main()
    assert [driver.branch("m:1", j) for j in (2, 0, 1)] == [False, False, True]
    assert driver.main() is not None
    assert driver.record().result == ["x", 0, 10, 20]
    assert calls == Counter({"before": 1, "b0": 1, "b1": 1, "b2": 1})  # the branch tasks only replayed "before"


def _lose_first_write(driver: Driver) -> int:
    """A producer's body: another execution journals step "s" of branch 0
    as 41 meanwhile, and this one's own value, 7, loses."""
    row = schema.StepRow.running(1, 1_000).settled(schema.value_outcome(41), 2_000).encode()
    commit = PendingCommit(0, schema.Identity.step("s"), schema.step_field("s"), "o41", "s", row)
    assert driver.journal().record("m.0.0", commit).winner is None
    return 7


def test_a_branch_whose_held_step_lost_its_first_write_runs_again_on_the_journaled_value() -> None:
    """A branch task holds its branch's last step back and journals it with
    the outcome. When another execution (a second delivery) journaled that
    step first, nothing of the branch is written: the branch runs again, the
    step replays the journaled value, and the outcome is computed from it."""
    runs: Counter[str] = Counter()

    @workflow(name="held", description="one branch, one step, then code on its value", phases=[])
    def held(ctx: WorkflowContext) -> Any:
        def branch() -> Any:
            runs["branch"] += 1
            return ctx.step("s", first_write_elsewhere) + 1

        return ctx.parallel([branch])

    driver = Driver.of(held)

    def first_write_elsewhere() -> int:
        return _lose_first_write(driver)

    driver.main()
    assert driver.branch("m:0", 0) is True
    assert runs["branch"] == 2, "the branch ran again once its step lost the write"
    assert driver.journal().branch_outcomes("m:0", 1) == ["o42"]
    assert driver.main() is not None
    assert driver.record().result == [42]
    assert driver.record().steps_done == 1


def test_a_branch_completion_carried_by_the_next_branch_that_lost_its_first_write_runs_again() -> None:
    """A task holding two branches sends the first one's held step and
    outcome with the second one's begin (``Completions``). When another execution
    journaled that step first, nothing of the first branch is written: it
    runs again on the journaled value, before the second one's outcome (the
    task's last) goes out and wakes the coordinator."""
    runs: Counter[str] = Counter()

    @workflow(name="carried", description="two branches of one step each", phases=[])
    def carried(ctx: WorkflowContext) -> Any:
        def first() -> Any:
            runs["first"] += 1
            return ctx.step("s", first_write_elsewhere) + 1

        def second() -> Any:
            runs["second"] += 1
            return ctx.step("t", lambda: 5)

        return ctx.parallel([first, second])

    driver = Driver.of(carried)

    def first_write_elsewhere() -> int:
        return _lose_first_write(driver)

    driver.main()
    assert driver.branch_task("m:0", (0, 1)) is True
    assert runs == Counter({"first": 2, "second": 1})
    assert driver.journal().branch_outcomes("m:0", 2) == ["o42", "o5"]
    assert driver.main() is not None
    assert driver.record().result == [42, 5]
    assert driver.record().steps_done == 2


def test_quick_branches_of_one_task_carry_each_completion_with_the_next_begin() -> None:
    """Three one-step branches in one task: every completion but the last
    travels with the next branch's first begin, and the last wakes the coordinator."""

    @workflow(name="three", description="three branches of one step each", phases=[])
    def three(ctx: WorkflowContext) -> Any:
        return ctx.parallel([lambda i=i: ctx.step(f"s{i}", lambda i=i: i) for i in range(3)])

    driver = Driver.of(three)
    driver.main()
    assert driver.branch_task("m:0", (0, 1, 2)) is True
    assert driver.journal().branch_outcomes("m:0", 3) == ["o0", "o1", "o2"]
    assert driver.main() is not None
    assert driver.record().result == [0, 1, 2]
    assert driver.record().steps_done == 3


def test_a_redelivered_branch_task_or_a_second_pass_sends_and_runs_nothing_again() -> None:
    calls.clear()
    driver = Driver.of(fan)
    driver.main()
    assert driver.main() is None  # another pass of the same execution: its branches are in flight
    driver.execution = "execution-again"
    assert driver.main() is None  # another execution after mark_sent: in flight too
    assert driver.branches == [("m:1", 0), ("m:1", 1), ("m:1", 2)]
    assert driver.deliver_branches() == [False, False, True]
    assert driver.branch("m:1", 1) is False
    assert calls["b1"] == 1


def test_an_ordinary_failure_leaves_none_and_a_pipeline_skips_the_items_later_stages() -> None:
    stages: list[tuple[str, int]] = []

    def parse(previous: Any, item: Any, index: int) -> int:
        stages.append(("parse", index))
        return int(item)

    def double(previous: int, item: Any, index: int) -> int:
        stages.append(("double", index))
        return previous * 2

    @workflow(name="pipe", description="A pipeline with one bad item", phases=[])
    def pipe(ctx: WorkflowContext) -> Any:
        return ctx.pipeline(["1", "two", "3"], parse, double)

    driver = Driver.of(pipe)
    assert driver.settle().result_json == "[2,null,6]"
    assert sorted(stages) == [("double", 0), ("double", 2), ("parse", 0), ("parse", 1), ("parse", 2)]
    raw = driver.journal().branch_outcomes("m:0", 3)[1]
    assert raw is not None and schema.decode_outcome(raw).error_type == "ValueError"


def test_a_fatal_branch_wakes_the_coordinator_at_once_and_aborts_the_call() -> None:
    @workflow(name="fatal-branch", description="One branch is cancelled", phases=[])
    def fatal_branch(ctx: WorkflowContext) -> Any:
        def stop() -> None:
            raise WorkflowCancelled("stop everything")

        try:
            return ctx.parallel([stop, lambda: 1, lambda: 2])
        except WorkflowCancelled:
            return "swallowed"  # the engine remembers: the run is cancelled anyway

    driver = Driver.of(fatal_branch)
    driver.main()
    assert driver.branch("m:0", 0) is True  # two branches still outstanding
    settlement = driver.main()
    assert settlement is not None and (settlement.status, settlement.reason) == ("cancelled", "cancelled")


def test_a_nested_fanout_runs_its_branches_at_once_in_threads_of_its_branch() -> None:
    both_in = threading.Barrier(2, timeout=10)

    def meet() -> bool:
        both_in.wait()  # only returns when the other nested branch is running too
        return True

    @workflow(name="nested", description="A branch that fans out again", phases=[])
    def nested(ctx: WorkflowContext) -> Any:
        def outer() -> Any:
            return ctx.parallel([lambda: ctx.step("n0", meet), lambda: ctx.step("n1", meet)])

        return ctx.parallel([outer])

    driver = Driver.of(nested)
    assert driver.settle().result_json == "[[true,true]]"
    assert driver.journal().read_sequence("m.0.0").live_entries() == [("p|2", None)]
    assert driver.journal().branch_outcomes("m.0.0:0", 2) == ["otrue", "otrue"]


def test_an_empty_fanout_needs_no_branch_task() -> None:
    @workflow(name="empty", description="Fans out over nothing", phases=[])
    def empty(ctx: WorkflowContext) -> Any:
        return ctx.parallel([])

    driver = Driver.of(empty)
    settlement = driver.main()
    assert settlement is not None and settlement.result_json == "[]"
    assert driver.branches == []


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def work_of(
    after: float, given: list[tuple[list[int], int]], fail: bool = False, busy: list[bool] | None = None
) -> tuple[BranchWork, Clock]:
    def hand_off(branches: list[int], tasks: int) -> bool:
        if fail:
            raise ConnectionError("broker down")
        if busy and busy.pop(0):
            return False
        given.append((branches, tasks))
        return True

    clock = Clock()
    # ``after`` in the clock's units; the watcher thread's first real look is
    # ``after`` seconds away, long after these tests call tick() themselves.
    return BranchWork("giver", hand_off, after, clock=clock), clock


def test_quick_branches_stay_in_their_task() -> None:
    given: list[tuple[list[int], int]] = []
    work, clock = work_of(60.0, given)
    work.start(range(8))
    taken = []
    while (branch := work.take()) is not None:
        taken.append(branch)
        clock.now += 1.0  # each a sixtieth of the hand-off delay
        if branch == 3:
            assert work.tick() is False  # four left at this pace: not worth new tasks
    work.close()
    assert taken == list(range(8)) and given == []


def test_a_slow_branch_hands_the_rest_on_one_task_each() -> None:
    given: list[tuple[list[int], int]] = []
    work, clock = work_of(60.0, given)
    work.start([0, 1, 2, 3])
    assert work.take() == 0
    clock.now = 60.0  # branch 0 has run the whole delay
    assert work.tick() is True
    assert given == [([1, 2, 3], 3)]  # a task each (up to fanout_tasks)
    assert work.take() is None
    work.close()


def test_many_quick_branches_stay_with_their_task() -> None:
    given: list[tuple[list[int], int]] = []
    work, clock = work_of(60.0, given)
    work.start(range(100))
    for _ in range(10):
        work.take()
        clock.now += 3.0
    assert work.tick() is False  # a new task would replay the body to run them
    assert given == []
    work.close()


def test_branches_that_could_not_be_handed_on_stay_with_their_task() -> None:
    given: list[tuple[list[int], int]] = []
    work, clock = work_of(60.0, given, fail=True)
    work.start([0, 1, 2])
    assert work.take() == 0
    clock.now = 61.0
    assert work.tick() is True
    assert [work.take(), work.take(), work.take()] == [1, 2, None]
    work.close()


def test_a_busy_fleet_leaves_the_branches_with_their_task_until_it_has_room() -> None:
    given: list[tuple[list[int], int]] = []
    work, clock = work_of(60.0, given, busy=[True, False])
    work.start([0, 1, 2])
    assert work.take() == 0
    clock.now = 60.0
    assert work.tick() is False  # a backlog: new tasks would only wait in it
    assert given == []
    clock.now = 120.0
    assert work.tick() is True
    assert given == [([1, 2], 2)]
    assert work.take() is None
    work.close()
