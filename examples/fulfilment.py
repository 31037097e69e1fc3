"""An order whose code changed under runs that wait: ``ctx.patched`` (docs/versioning.md).

The first version of this workflow reserved the stock, waited for a person
to approve the order (the signal ``approval``), then charged it. This
version checks the order for fraud before the wait. Runs that were already
waiting when it was deployed went past that point under the first version:
for them ``ctx.patched("fraud-check")`` is False and they keep the old path;
every run that reaches it under this code journals a marker and checks::

    celery-durable run order-fulfilment --app examples.fulfilment:engine --args '{"order": "A-1", "amount": 30}'
    celery-durable runs approve RUN --app examples.fulfilment:engine

``examples/histories/`` keeps one history of each kind, as ``celery-durable
runs export RUN`` prints them: a run of the first version waiting for
approval, and a run of this one, which took the new branch.
``tests/test_example_histories.py`` replays both against this code with
``celery_durable.testing.replay_history``: what a test suite does before a
deploy, so that a change that would break a run in flight fails there.

Once no run of the first version is left (``celery-durable replay-check``
against code without the old branch says so), the ``if`` goes: call
``ctx.deprecate_patch("fraud-check")`` where it stood and check
unconditionally; the marker the second kind of run journaled is consumed
there, so they still replay.
"""

from __future__ import annotations

import hashlib
from typing import Any

from celery_durable import Engine, WorkflowContext, workflow


def reserve(order: str) -> dict[str, Any]:
    """Stands in for the warehouse: the order's stock, held under a stable reference."""
    return {"order": order, "reservation": "RES-" + hashlib.sha256(order.encode()).hexdigest()[:8]}


def fraud_score(order: str, amount: float) -> dict[str, Any]:
    """Stands in for a fraud service: large orders are held for review."""
    return {"order": order, "score": min(1.0, amount / 1000), "hold": amount >= 1000}


def charge(order: str, amount: float, idempotency_key: str) -> dict[str, Any]:
    """Stands in for the payment provider; a real one must honour the key."""
    return {"charged": amount, "payment": "PAY-" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:8]}


@workflow(
    name="order-fulfilment",
    description="Reserves an order's stock, checks it for fraud, waits for approval, charges it",
    phases=[
        {"title": "Reserve"},
        {"title": "Approve", "detail": "Waits for the signal 'approval'"},
        {"title": "Charge"},
    ],
)
def fulfilment(ctx: WorkflowContext) -> dict[str, Any]:
    order, amount = str(ctx.args.get("order", "A-1")), float(ctx.args.get("amount", 0))
    ctx.phase("Reserve")
    reservation = ctx.step("reserve", lambda: reserve(order))
    screened: dict[str, Any] | None = None
    if ctx.patched("fraud-check"):
        screened = ctx.step("fraud-check", lambda: fraud_score(order, amount))
        if screened["hold"]:
            ctx.log(f"Held for review: fraud score {screened['score']}")
    ctx.phase("Approve")
    decision = ctx.wait_for_signal("approval")
    payload = decision.payload if isinstance(decision.payload, dict) else {}
    if not payload.get("approved"):
        return {**reservation, "status": "rejected", "fraud_check": screened}
    ctx.phase("Charge")
    payment = ctx.step("charge", lambda: charge(order, amount, ctx.idempotency_key("charge")))
    return {**reservation, **payment, "status": "charged", "fraud_check": screened}


engine = Engine(workflows=[fulfilment])
celery_app = engine.celery
