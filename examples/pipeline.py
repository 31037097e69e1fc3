"""Fan-out and pipeline: documents fetched in parallel, then each one through
three stages with no barrier between documents, then one report.

- ``ctx.parallel`` is a barrier: every fetch runs as its own branch across
  the worker fleet, and the workflow goes on when all are journaled.
- ``ctx.pipeline(items, *stages)`` runs each item through
  ``stage(previous, item, index)`` on its own branch; a slow document does
  not hold the others back. A stage that raises gives ``None`` for that
  item and skips its later stages, without disturbing the rest.

Every stage does its work in a ``ctx.step``, so a resumed run replays the
documents already processed and runs only what is missing.

    celery-durable run pipeline --app examples.pipeline:engine --args '{"delay": 0.5}' --follow
"""

from __future__ import annotations

import re
import time
from collections import Counter
from functools import partial
from typing import Any

from celery_durable import Engine, WorkflowContext, workflow

DOCUMENTS = {
    "seed": "Copilot remembered the bookings. Why could it not resume the workflow? A ledger "
    "remembers what happened; a durable orchestrator replays it and picks up at the next step.",
    "spec": "A run that was interrupted by a crash resumes from its journal and finishes, without "
    "running completed work again. That last sentence is the product.",
    "fencing": "Every attempt holds an epoch, a fencing token checked atomically in Redis on every "
    "write, so exactly one attempt has the authority to advance a run.",
    "steps": "Steps run at least once: pass the idempotency key to whatever they call, and a step "
    "that runs twice books once.",
}
STOPWORDS = frozenset(
    ["a", "an", "and", "at", "by", "it", "on", "of", "in", "is", "the", "to", "so", "one", "what", "why", "that"]
)


@workflow(
    name="pipeline",
    description="Fetches documents in parallel, runs each through three stages, reports",
    phases=[
        {"title": "Fetch", "detail": "One branch per document"},
        {"title": "Process", "detail": "tokenize → count → summarize, no barrier between documents"},
        {"title": "Report"},
    ],
    args_schema={
        "type": "object",
        "properties": {
            "documents": {"type": "array", "items": {"enum": sorted(DOCUMENTS)}, "minItems": 1},
            "delay": {"type": "number", "minimum": 0, "maximum": 10},
        },
    },
)
def pipeline(ctx: WorkflowContext) -> dict[str, Any]:
    names: list[str] = ctx.args.get("documents") or sorted(DOCUMENTS)
    delay: float = ctx.args.get("delay", 0.2)

    ctx.phase("Fetch")
    ctx.log(f"Fetching {len(names)} documents, {delay:g} s each, in parallel")
    texts = ctx.parallel([partial(fetch, ctx, name, delay) for name in names])

    ctx.phase("Process")
    items = [{"name": name, "text": text} for name, text in zip(names, texts, strict=True)]
    summaries = ctx.pipeline(items, partial(tokenize, ctx), partial(count, ctx), partial(summarize, ctx))

    ctx.phase("Report")
    return ctx.step("report", lambda: report(summaries))


def fetch(ctx: WorkflowContext, name: str, delay: float) -> str:
    def download() -> str:
        time.sleep(delay)  # stands in for a slow download
        return DOCUMENTS[name]

    text: str = ctx.step(f"fetch:{name}", download)
    ctx.log(f"fetched {name} ({len(text)} characters)")
    return text


def tokenize(ctx: WorkflowContext, previous: dict[str, Any], item: dict[str, Any], index: int) -> list[str]:
    words: list[str] = ctx.step(
        f"tokenize:{item['name']}",
        lambda: [w for w in re.findall(r"[a-z]+", previous["text"].lower()) if w not in STOPWORDS],
    )
    return words


def count(ctx: WorkflowContext, previous: list[str], item: dict[str, Any], index: int) -> list[list[Any]]:
    top: list[list[Any]] = ctx.step(
        f"count:{item['name']}",
        lambda: [[word, n] for word, n in Counter(previous).most_common(3)],
    )
    return top


def summarize(ctx: WorkflowContext, previous: list[list[Any]], item: dict[str, Any], index: int) -> dict[str, Any]:
    summary: dict[str, Any] = ctx.step(
        f"summarize:{item['name']}",
        lambda: {"document": item["name"], "top_words": [word for word, _ in previous]},
    )
    ctx.log(f"{item['name']}: {', '.join(summary['top_words'])}")
    return summary


def report(summaries: list[Any]) -> dict[str, Any]:
    done = [summary for summary in summaries if summary is not None]
    words = Counter(word for summary in done for word in summary["top_words"])
    return {"documents": len(summaries), "processed": len(done), "common": sorted(w for w, n in words.items() if n > 1),
            "summaries": done}


engine = Engine(workflows=[pipeline])
