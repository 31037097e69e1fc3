"""Engines of several teams, loaded by worker processes that share one Redis
and the same queue names (``tests/test_unserved.py``): each knows only its
own workflows, as ``billflow:engine`` and ``myflow:engine`` would."""

from __future__ import annotations

from typing import Any

from celery_durable import Engine, WorkflowContext, workflow


@workflow(name="echo", description="known to every worker", phases=[])
def echo(ctx: WorkflowContext) -> Any:
    return ctx.step("echo", lambda: ctx.args)


@workflow(name="ghost", description="known to the billing team only", phases=[])
def ghost(ctx: WorkflowContext) -> Any:
    return ctx.step("boo", lambda: "boo")


@workflow(name="ghost-fan", description="fans out; known to the billing team only", phases=[])
def ghost_fan(ctx: WorkflowContext) -> Any:
    return ctx.parallel([lambda: ctx.step("a", lambda: 1), lambda: ctx.step("b", lambda: 2)])


@workflow(name="bill", description="the billing team's", phases=[])
def bill(ctx: WorkflowContext) -> Any:
    return ctx.parallel([lambda: ctx.step("charge", lambda: "charged"), lambda: ctx.step("mail", lambda: "mailed")])


@workflow(name="order", description="the shop team's", phases=[])
def order(ctx: WorkflowContext) -> Any:
    return [ctx.step("reserve", lambda: "reserved"), ctx.step("ship", lambda: ctx.args["n"])]


EVERY = [echo, ghost, ghost_fan, bill, order]

partial = Engine(workflows=[echo])
billing = Engine(workflows=[echo, ghost, ghost_fan, bill])
shop = Engine(workflows=[echo, order])
