"""A code review: changed files reviewed one after another by an agent.

``examples/changed/`` holds two files: a cart total whose
``reduce`` lacks its initial ``0``, and a discount that subtracts the
percentage instead of multiplying by it. Each file is read in a step and
reviewed by one ``ctx.agent`` turn; a summary step collects the findings. The
review of the first file is journaled before the second starts, so a run
killed during the second review resumes without paying for the first again.

Who reviews: with ``CELERY_DURABLE_AGENT_RUNNER``, that runner; with
``CELERY_DURABLE_OPENAI_BASE_URL`` or ``CELERY_DURABLE_OPENAI_MODEL``, an
OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, LiteLLM...); otherwise
``rule_reviewer`` below on a ``FunctionRunner``: two checks, no model.

    celery-durable run code-review --app examples.code_review:engine --follow
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from celery_durable import AgentRequest, AgentRunner, Engine, FunctionRunner, Settings, WorkflowContext, workflow
from celery_durable.agents import openai_runner

CHANGED = Path(__file__).parent / "changed"
DEFAULT_FILES = ["cart.js", "discount.js"]

FINDING = {
    "type": "object",
    "required": ["line", "severity", "message"],
    "properties": {
        "line": {"type": "integer", "minimum": 1},
        "severity": {"enum": ["bug", "warning", "nit"]},
        "message": {"type": "string"},
        "fix": {"type": "string"},
    },
}
REVIEW_SCHEMA = {
    "type": "object",
    "required": ["file", "findings"],
    "properties": {"file": {"type": "string"}, "findings": {"type": "array", "items": FINDING}},
}


@workflow(
    name="code-review",
    description="Reviews changed files one after another and summarizes the findings",
    phases=[{"title": "Review", "detail": "One agent turn per file, in sequence"}, {"title": "Summarize"}],
    args_schema={
        "type": "object",
        "properties": {"files": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}},
    },
)
def code_review(ctx: WorkflowContext) -> dict[str, Any]:
    files = ctx.args.get("files") or DEFAULT_FILES
    ctx.phase("Review")
    reviews = []
    for name in files:
        source = ctx.step(f"read:{name}", lambda name=name: read_changed(name))  # I/O belongs in a step
        ctx.log(f"Reviewing {name} ({len(source)} bytes)")
        review = ctx.agent(review_prompt(name, source), label="reviewer", schema=REVIEW_SCHEMA)
        if review is None:
            ctx.log(f"{name}: the review failed; its agent row says why")
        else:
            ctx.log(f"{name}: {len(review['findings'])} finding(s)")
        reviews.append({"file": name, "review": review})
    ctx.phase("Summarize")
    return ctx.step("summary", lambda: summarize(reviews))


def read_changed(name: str) -> str:
    """A file of ``examples/changed/``; a name that leaves the folder is refused."""
    if Path(name).name != name:
        raise ValueError(f"not a file name of examples/changed/: {name!r}")
    return (CHANGED / name).read_text(encoding="utf-8")


def review_prompt(name: str, source: str) -> str:
    return (
        "Review this changed file for bugs. Reply with JSON only: "
        '{"file": <name>, "findings": [{"line": <1-based>, "severity": "bug"|"warning"|"nit", '
        '"message": <what is wrong and its effect>, "fix": <the corrected line>}]}.\n'
        f"File: {name}\n```js\n{source}```\n"
    )


def summarize(reviews: list[dict[str, Any]]) -> dict[str, Any]:
    findings = [
        {"file": entry["file"], **finding}
        for entry in reviews
        if entry["review"] is not None
        for finding in entry["review"]["findings"]
    ]
    return {
        "files": len(reviews),
        "reviewed": sum(entry["review"] is not None for entry in reviews),
        "bugs": sum(finding["severity"] == "bug" for finding in findings),
        "findings": findings,
    }


# --- the reviewer without a model -----------------------------------------------------------

_FILE = re.compile(r"^File: (?P<name>.+)$", re.MULTILINE)
_CODE = re.compile(r"```js\n(?P<code>.*?)```", re.DOTALL)
_SUBTRACTED_PERCENT = re.compile(r"return\s+(?P<price>\w+)\s*-\s*(?P<percent>\w*(?:percent|pct)\w*)\s*;", re.I)


def rule_reviewer(request: AgentRequest) -> dict[str, Any]:
    """Two checks a reviewer would make of these files; JSON as the schema asks."""
    name = _FILE.search(request.prompt)
    code = _CODE.search(request.prompt)
    source = code["code"] if code else ""
    findings: list[dict[str, Any]] = []
    for number, line in enumerate(source.splitlines(), start=1):
        findings += _reduce_without_initial_value(number, line)
        match = _SUBTRACTED_PERCENT.search(line)
        if match:
            price, percent = match["price"], match["percent"]
            findings.append({
                "line": number,
                "severity": "bug",
                "message": f"subtracts the percentage itself from {price} (80 - 25 = 55, not 60)",
                "fix": f"return {price} * (1 - {percent} / 100);",
            })
    return {"file": name["name"] if name else "?", "findings": findings}


def _reduce_without_initial_value(number: int, line: str) -> list[dict[str, Any]]:
    start = line.find(".reduce(")
    if start < 0:
        return []
    args = _top_level_args(line[start + len(".reduce(") :])
    if len(args) != 1:
        return []
    return [{
        "line": number,
        "severity": "bug",
        "message": "reduce() has no initial value: the first item becomes the accumulator, so the total "
        "starts from an object ('[object Object]...') and an empty cart throws a TypeError",
        "fix": line.strip().replace(args[0] + ")", args[0] + ", 0)", 1),
    }]


def _top_level_args(text: str) -> list[str]:
    """The arguments of a call whose opening parenthesis came just before ``text``."""
    args, depth, current = [], 0, ""
    for char in text:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                return [*args, current.strip()] if current.strip() else args
            depth -= 1
        elif char == "," and depth == 0:
            args.append(current.strip())
            current = ""
            continue
        current += char
    return args


def reviewer_runner(settings: Settings) -> AgentRunner | None:
    """The configured runner, else an OpenAI-compatible endpoint if one is set, else the rules."""
    if settings.agent_runner:
        return None  # the engine loads it from the setting
    if settings.openai_base_url or settings.openai_model:
        return openai_runner()
    return FunctionRunner(routes={"reviewer": rule_reviewer})


settings = Settings()
engine = Engine(workflows=[code_review], settings=settings, agent_runner=reviewer_runner(settings))
