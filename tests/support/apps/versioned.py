"""Four deploys of one workflow, ``order``, for worker processes that
``tests/test_versioning.py`` starts one after another (SPEC §8a):

- ``v1``: reserve, wait for approval, charge;
- ``v2``: a fraud check inserted before the wait, guarded by ``ctx.patched``;
- ``v3``: the old branch dropped, ``ctx.deprecate_patch`` kept;
- ``unguarded``: the fraud check inserted without a patch (what breaks runs);
- ``renamed``: ``reserve`` renamed ``reserve-stock`` (what breaks them too);
- ``other``: another team's engine, which does not know ``order``.

Each is a factory: the CLI calls it when it loads ``--app``, so an engine is
built from the test's environment for that version only.
"""

from __future__ import annotations

from typing import Any

from celery_durable import Engine, WorkflowContext, define_workflow

META = {"name": "order", "description": "Reserves stock, waits for approval, charges", "phases": []}


def _charge(ctx: WorkflowContext, checked: Any) -> Any:
    approval = ctx.wait_for_signal("approval")
    charged = ctx.step("charge", lambda: approval.payload)
    return {"order": ctx.args.get("order"), "charged": charged, "fraud_check": checked}


def order_v1(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: "reserved")
    return _charge(ctx, None)


def order_v2(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: "reserved")
    checked = None
    if ctx.patched("fraud-check"):
        checked = ctx.step("fraud-check", lambda: "clean")
    return _charge(ctx, checked)


def order_v3(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: "reserved")
    ctx.deprecate_patch("fraud-check")
    return _charge(ctx, ctx.step("fraud-check", lambda: "clean"))


def order_unguarded(ctx: WorkflowContext) -> Any:
    ctx.step("reserve", lambda: "reserved")
    return _charge(ctx, ctx.step("fraud-check", lambda: "clean"))


def order_renamed(ctx: WorkflowContext) -> Any:
    ctx.step("reserve-stock", lambda: "reserved")
    return _charge(ctx, None)


ORDER = {
    name: define_workflow(META, run)
    for name, run in (
        ("v1", order_v1),
        ("v2", order_v2),
        ("v3", order_v3),
        ("unguarded", order_unguarded),
        ("renamed", order_renamed),
    )
}


def v1() -> Engine:
    return Engine(workflows=[ORDER["v1"]])


def v2() -> Engine:
    return Engine(workflows=[ORDER["v2"]])


def v3() -> Engine:
    return Engine(workflows=[ORDER["v3"]])


def unguarded() -> Engine:
    return Engine(workflows=[ORDER["unguarded"]])


def renamed() -> Engine:
    return Engine(workflows=[ORDER["renamed"]])


def other() -> Engine:
    return Engine(workflows=[define_workflow({**META, "name": "invoice"}, order_v1)])
