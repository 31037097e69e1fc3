"""An agent fan-out under a fleet-wide requests-per-minute limit (a throttle).

An LLM provider allows so many requests a minute to one API key, whichever
worker sends them. ``summarize-tickets`` sends one ``ctx.agent`` turn per
ticket in parallel, each under the throttle ``llm``: at most
``LLM_CONCURRENCY`` turns at once and ``LLM_PER_MINUTE`` a minute across the
whole fleet, and at most one at a time per customer (``throttle_key``). A
turn waiting for its slot holds no worker; the throttle lives in Redis, so an
operator changes it at runtime (``celery-durable throttles set llm --rate
120/60``) without a deploy, and the turns waiting go at once.

    celery-durable throttles set llm --app examples.rate_limited_agents:engine \\
        --concurrency 4 --rate 60/60 --per-key-concurrency 1
    celery-durable run summarize-tickets --app examples.rate_limited_agents:engine --follow

``ensure_throttle(client)`` does the first line from code. The reviewer is a
``FunctionRunner`` here (no model): point ``CELERY_DURABLE_AGENT_RUNNER`` at
an ``OpenAIChatRunner`` factory for a real one.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from celery_durable import AgentRequest, Client, Engine, FunctionRunner, WorkflowContext, workflow

LLM = "llm"
LLM_CONCURRENCY = 4
LLM_PER_MINUTE = 60

TICKETS = [
    {"id": 1, "customer": "acme", "text": "The export button does nothing on Safari."},
    {"id": 2, "customer": "acme", "text": "Invoices show last month's VAT rate."},
    {"id": 3, "customer": "globex", "text": "Please add SSO with Okta."},
    {"id": 4, "customer": "initech", "text": "The dashboard times out after 30 seconds."},
]


def summarize(request: AgentRequest) -> dict[str, Any]:
    """A stand-in for the model: a one-line summary and a label."""
    text = request.prompt.split(":", 1)[-1].strip()
    kind = "feature" if "add" in text.lower() else "bug"
    return {"summary": text[:60], "kind": kind}


SUMMARY = {
    "type": "object",
    "required": ["summary", "kind"],
    "properties": {"summary": {"type": "string"}, "kind": {"enum": ["bug", "feature"]}},
}


@workflow(
    name="summarize-tickets",
    description="Summarizes support tickets with one agent turn each, under the fleet's LLM limit",
    phases=[{"title": "Summarize", "detail": "One rate-limited agent turn per ticket, in parallel"}],
)
def summarize_tickets(ctx: WorkflowContext) -> dict[str, Any]:
    tickets = ctx.args.get("tickets") or TICKETS
    ctx.phase("Summarize")

    def one(ticket: dict[str, Any]) -> Any:
        return ctx.agent(
            f"Summarize ticket {ticket['id']}: {ticket['text']}",
            label="summarizer",
            schema=SUMMARY,
            throttle=LLM,  # a slot of the fleet-wide limit while the turn runs
            throttle_key=ticket["customer"],  # and one turn at a time per customer
        )

    results = ctx.parallel([partial(one, t) for t in tickets])
    return {"tickets": len(tickets), "summaries": results}


def ensure_throttle(client: Client) -> None:
    """The provider's limits as a throttle (idempotent: set again, it replaces them)."""
    client.set_throttle(LLM, concurrency=LLM_CONCURRENCY, rate=(LLM_PER_MINUTE, 60), per_key_concurrency=1)


engine = Engine(workflows=[summarize_tickets], agent_runner=FunctionRunner(default=summarize))
celery_app = engine.celery
