"""How many celery_durable modules a pass crosses, and how often it bounces back.

Issue 36 measured the shape of a pass with a ``sys.setprofile`` trace of
the in-process environment: a wide pass (many modules) and many A→B→A
re-entries (module A calls B which calls back into A) are what let a new
path re-open an old hole. This script measures the same thing so the number
can be rerun after a change:

    PYTHONPATH=. python -m benchmarks.pass_trace

For three runs — two steps, one ``ctx.call`` of a task, a fan-out of two —
only the code under a durable task's entry is traced (the coordinator, a
branch task, a call's answer), in every thread, and of it only the package's
own modules (``celery_durable.testing``, the environment, is not counted).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from celery_durable import WorkflowContext, define_workflow
from celery_durable.testing import WorkflowTestEnvironment

PACKAGE = "celery_durable"
ENTRIES = {
    # Where a durable task's message is handed to the engine, before and after
    # issue 36 (a call's answer used to bypass tasks.entry).
    ("celery_durable.tasks.entry", "run_durable_task"),
    ("celery_durable.tasks.calls", "call_succeeded"),
    ("celery_durable.tasks.calls", "call_failed"),
    ("celery_durable.tasks.calls", "answer_in_place"),
}


@dataclass
class Trace:
    """Modules entered under a durable task's entry, and the A→B→A re-entries among them."""

    modules: set[str] = field(default_factory=set)
    reentries: int = 0
    bounces: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(A, B) -> how often B called back into A."""
    active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    local: threading.local = field(default_factory=threading.local)

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event not in ("call", "return"):
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(PACKAGE) or module.startswith(PACKAGE + ".testing"):
            return
        entry = (module, frame.f_code.co_name) in ENTRIES
        # The thread's stack of the package's frames, runs of one module collapsed: [module, depth].
        stack: list[list[Any]] = self.local.__dict__.setdefault("stack", [])
        if event == "return":
            if stack:
                stack[-1][1] -= 1
                if stack[-1][1] == 0:
                    stack.pop()
            if entry:
                with self.lock:
                    self.active -= 1
            return
        if entry:
            with self.lock:
                self.active += 1
        if stack and stack[-1][0] == module:
            stack[-1][1] += 1
            return
        if self.active > 0:
            self.modules.add(module)
            if len(stack) >= 2 and stack[-2][0] == module:
                self.reentries += 1
                self.bounces[module, stack[-1][0]] += 1
        stack.append([module, 1])


class Tracer:
    """One profile function in every thread, installed before the first
    thread starts (a worker's body threads live on between runs, and a
    thread's profile function is fixed when it starts): it feeds the trace
    under way, if any."""

    def __init__(self) -> None:
        self.current: Trace | None = None
        threading.setprofile(self.profile)
        sys.setprofile(self.profile)

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        trace = self.current
        if trace is not None:
            trace.profile(frame, event, arg)

    def traced(self, drive: Callable[[], Any]) -> Trace:
        self.current = Trace()
        try:
            drive()
        finally:
            trace, self.current = self.current, None
        return trace


def two_steps(ctx: WorkflowContext) -> int:
    first = ctx.step("one", lambda: 1)
    return int(ctx.step("two", lambda: first + 1))


def one_call(ctx: WorkflowContext) -> Any:
    return ctx.call("resize", "fleet.resize", args=("a.png",))


def fanout_of_two(ctx: WorkflowContext) -> Any:
    return ctx.parallel([lambda: ctx.step("a", lambda: 1), lambda: ctx.step("b", lambda: 2)])


def resize(url: str) -> str:
    return url.upper()


CASES = {
    "two-step-pass": two_steps,
    "call-answer": one_call,
    "fanout-of-two": fanout_of_two,
}


def measure() -> dict[str, Trace]:
    tracer = Tracer()
    workflows = [define_workflow({"name": name, "description": name, "phases": []}, fn) for name, fn in CASES.items()]
    env = WorkflowTestEnvironment(workflows, tasks={"fleet.resize": resize})
    for workflow in workflows:
        env.run(workflow)  # warm: imports and script loads are not the pass
    results: dict[str, Trace] = {}
    for workflow in workflows:
        results[workflow.name] = tracer.traced(functools.partial(_completed, env, workflow))
    return results


def _completed(env: WorkflowTestEnvironment, workflow: Any) -> None:
    envelope = env.run(workflow)
    assert envelope.status == "completed", envelope


def main() -> None:
    for name, trace in measure().items():
        outside = len([m for m in trace.modules if not m.startswith(PACKAGE + ".broker")])
        print(f"{name}: {len(trace.modules)} modules ({outside} outside broker/), {trace.reentries} A->B->A re-entries")
        if "-v" in sys.argv:
            for module in sorted(trace.modules):
                print(f"    {module}")
            for (a, b), n in trace.bounces.most_common():
                print(f"    {n:3d}  {a} -> {b} -> {a}")


if __name__ == "__main__":
    main()
