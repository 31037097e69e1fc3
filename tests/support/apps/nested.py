"""A parent and its children, touching nothing but the journal: for the
command line's view of child runs."""

from __future__ import annotations

from typing import Any

from celery_durable import Engine, WorkflowContext, workflow


@workflow(name="nest-leaf", description="Returns what it was given", phases=[])
def nest_leaf(ctx: WorkflowContext) -> Any:
    return ctx.step("echo", lambda: ctx.args)


@workflow(name="nest-parent", description="Waits for one child, starts another", phases=[])
def nest_parent(ctx: WorkflowContext) -> Any:
    ctx.start_child("loose", "nest-leaf", {"detached": True})
    return ctx.child("kid", "nest-leaf", {"n": 1})


def make_engine() -> Engine:
    """Built when the command runs, from the test's environment."""
    return Engine(workflows=[nest_leaf, nest_parent])
