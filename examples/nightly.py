"""Composing runs: a nightly report that fans out to one child run per customer.

``ctx.child(key, workflow, args)`` runs another registered workflow as a
child of this run and returns its result. Each customer's report is a run of
its own — its own journal, progress, limits and retries, visible in ``runs
list`` and the web view, linked to its parent — while the parent waits for
all of them holding no worker (``ctx.parallel`` of children: they run across
the fleet). A child's run id is derived from the parent's and the key, so a
parent that crashes and is taken over finds the children it started instead
of starting them again; a child that fails raises ``ChildWorkflowFailed`` in
the parent, here caught and reported, so one bad customer does not sink the
night.

    celery-durable run nightly-report --app examples.nightly:engine --args '{"customers": ["acme", "empty-co"]}'
"""

from __future__ import annotations

import hashlib
from functools import partial
from typing import Any

from celery_durable import ChildWorkflowFailed, Engine, WorkflowContext, workflow

NAME = {"type": "string", "pattern": "^[a-z][a-z0-9-]{0,39}$"}


@workflow(
    name="customer-report",
    description="One customer's figures for the night",
    phases=[{"title": "Collect"}, {"title": "Summarize"}],
    args_schema={"type": "object", "properties": {"customer": NAME}, "required": ["customer"]},
    limits={"timeout_seconds": 300},
)
def customer_report(ctx: WorkflowContext) -> dict[str, Any]:
    customer = ctx.args["customer"]
    ctx.phase("Collect")
    orders = ctx.step("orders", lambda: fake_orders(customer))
    ctx.log(f"{customer}: {len(orders)} orders")
    if not orders:
        raise ValueError(f"{customer} has no orders: nothing to report")
    ctx.phase("Summarize")
    return ctx.step("summary", lambda: {"customer": customer, "orders": len(orders), "total": sum(orders)})


@workflow(
    name="nightly-report",
    description="A report per customer, each a child run, then the night's totals",
    phases=[{"title": "Customers", "detail": "One child run per customer, in parallel"}, {"title": "Totals"}],
    args_schema={"type": "object", "properties": {"customers": {"type": "array", "items": NAME, "minItems": 1}}},
)
def nightly_report(ctx: WorkflowContext) -> dict[str, Any]:
    customers: list[str] = ctx.args.get("customers") or ["acme", "globex", "initech"]
    ctx.phase("Customers")

    def report(customer: str) -> Any:
        try:
            return ctx.child(f"report-{customer}", customer_report, {"customer": customer})
        except ChildWorkflowFailed as exc:
            ctx.log(f"{customer}: child run {exc.child_run_id} ended {exc.child_status}")
            return {"customer": customer, "failed": exc.child_status}

    reports = ctx.parallel([partial(report, customer) for customer in customers])
    ctx.phase("Totals")
    done = [r for r in reports if "total" in r]
    return {
        "customers": len(customers),
        "reported": len(done),
        "total": sum(r["total"] for r in done),
        "reports": reports,
    }


def fake_orders(customer: str) -> list[int]:
    """A customer's order amounts, the same on every call (a stand-in for a database query)."""
    if customer.startswith("empty"):
        return []
    digest = hashlib.sha256(customer.encode()).digest()
    return [10 + byte % 90 for byte in digest[: 3 + digest[0] % 5]]


engine = Engine(workflows=[customer_report, nightly_report])
