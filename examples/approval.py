"""An expense that waits for a person: approval with reminders and a deadline.

The run records the claim, then waits for the signal ``approval`` — holding
no worker, for as long as it takes, across restarts of every worker. While
nobody decides, a reminder goes out every ``remind_after_seconds``; after
``reminders`` of them the deadline has passed and the claim expires. A
decision pays the claim, or rejects it with the approver's note::

    celery-durable run expense-approval --app examples.approval:engine \\
        --args '{"employee": "ada", "amount": 120, "remind_after_seconds": 3600}'
    celery-durable runs approve RUN --app examples.approval:engine --note "ok, team dinner"
    celery-durable runs approve RUN --app examples.approval:engine --reject --note "no receipt"

(``runs approve`` sends the signal ``approval`` with ``{"approved": true|false,
"note": ...}``; the web view has the same buttons.)
"""

from __future__ import annotations

import hashlib
from typing import Any

from celery_durable import Engine, WorkflowContext, workflow


def record_claim(claim: dict[str, Any]) -> dict[str, Any]:
    """Stands in for the expense system: the claim gets a stable id."""
    digest = hashlib.sha256(f"{claim.get('employee')}:{claim.get('amount')}".encode()).hexdigest()[:8]
    return {"claim": f"EXP-{digest}", "employee": claim.get("employee", "someone"), "amount": claim.get("amount", 0)}


def notify(approver: str, text: str) -> dict[str, str]:
    """Stands in for email or chat: a real one would send ``text`` to ``approver``."""
    return {"to": approver, "text": text}


def pay(claim: dict[str, Any], idempotency_key: str) -> dict[str, Any]:
    """Stands in for the payment provider; a real one must honour the key."""
    return {"paid": claim["amount"], "reference": "PAY-" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:8]}


@workflow(
    name="expense-approval",
    description="Records an expense claim, waits for a person to approve it, then pays it",
    phases=[
        {"title": "Submit"},
        {"title": "Approve", "detail": "Waits for the signal 'approval', with reminders"},
        {"title": "Pay"},
    ],
)
def expense_approval(ctx: WorkflowContext) -> dict[str, Any]:
    ctx.phase("Submit")
    claim = ctx.step("record-claim", lambda: record_claim(ctx.args))
    approver = str(ctx.args.get("approver", "finance@example.com"))
    every = float(ctx.args.get("remind_after_seconds", 3600))
    reminders = int(ctx.args.get("reminders", 3))

    ctx.phase("Approve")
    ctx.step("ask", lambda: notify(approver, f"Please approve {claim['claim']} ({claim['amount']})"))
    for reminder in range(reminders + 1):
        decision = ctx.wait_for_signal("approval", timeout=every)
        if decision.received:
            break
        if reminder < reminders:
            ctx.log(f"No decision yet: reminder {reminder + 1} of {reminders}")
            text = f"Reminder {reminder + 1}: {claim['claim']}"
            ctx.step(f"remind-{reminder + 1}", lambda text=text: notify(approver, text))
    else:
        ctx.log("No decision before the deadline: the claim expired")
        return {"claim": claim["claim"], "status": "expired"}

    payload = decision.payload if isinstance(decision.payload, dict) else {}
    note = payload.get("note")
    if not payload.get("approved"):
        ctx.log(f"Rejected: {note or 'no note'}")
        return {"claim": claim["claim"], "status": "rejected", "note": note}
    ctx.phase("Pay")
    payment = ctx.step("pay", lambda: pay(claim, ctx.idempotency_key("pay")))
    return {"claim": claim["claim"], "status": "paid", "note": note, **payment}


engine = Engine(workflows=[expense_approval])
celery_app = engine.celery
