"""The README's pictures of the web view: ``python -m tests.web.screenshots``.

Starts a private Redis, an in-process worker and the web view, runs a few
code-review workflows (one held mid-way, so the run page has a live phase,
agent turns and progress), and has headless Chromium save
``docs/web-runs.png`` (two runs selected for a bulk action),
``docs/web-fleet.png`` and ``docs/web-run.png``.
"""

from __future__ import annotations

import sys
import threading
import uuid
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from celery_durable import AgentRequest, AgentResult, Engine, FunctionRunner, Settings, define_workflow
from celery_durable.local.redis_server import RedisServer
from celery_durable.web import create_app
from tests.conftest import worker_thread
from tests.support.poll import RUN_BOUND, poll
from tests.web.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.web.support import serving

DOCS = Path(__file__).resolve().parents[2] / "docs"
release = threading.Event()


def review(request: AgentRequest) -> AgentResult:
    tokens = 180 + 37 * len(request.prompt) % 400
    return AgentResult(
        output={"bugs": [], "file": request.prompt.rsplit(" ", 1)[-1]},
        usage={"prompt_tokens": tokens, "completion_tokens": tokens // 3, "ai_credits": tokens / 100_000},
    )


def hold(ctx: Any) -> bool:
    while not release.wait(0.05):
        if ctx.cancelled():
            return False
    return True


def _run(ctx: Any) -> Any:
    ctx.phase("Analyze")
    files = ctx.step("changed-files", lambda: ctx.args["files"])
    ctx.log(f"Reviewing {len(files)} changed files")
    findings = [ctx.agent(f"Review {f}", label="reviewer", schema={"type": "object"}) for f in files]
    ctx.phase("Summarize")
    ctx.log("Writing the summary")
    if ctx.args.get("hold"):
        ctx.step("approve-summary", lambda: hold(ctx))
    return ctx.step("summary", lambda: {"files": len(files), "findings": findings})


code_review = define_workflow(
    {
        "name": "code-review",
        "description": "Reviews changed files and summarizes findings",
        "phases": [
            {"title": "Analyze", "detail": "Inspect changed files"},
            {"title": "Summarize"},
            {"title": "Publish", "detail": "Post the review"},
        ],
    },
    _run,
)


def main() -> int:
    tag = uuid.uuid4().hex[:8]
    with RedisServer() as redis_server:
        settings = Settings(
            redis_url=redis_server.url, key_prefix=f"shot{tag}", coordinator_queue=f"shot{tag}.c",
            steps_queue=f"shot{tag}.s", agents_queue=f"shot{tag}.a",
        )
        engine = Engine([code_review], settings, agent_runner=FunctionRunner(default=review))
        client = engine.client()
        try:
            shoot(engine, client)
        finally:
            release.set()
    print(f"wrote {DOCS / 'web-runs.png'}, {DOCS / 'web-fleet.png'} and {DOCS / 'web-run.png'}")
    return 0


def shoot(engine: Engine, client: Any) -> None:
    with worker_thread(engine), serving(create_app(engine, flower_url="http://127.0.0.1:5555")) as url:
        for files in (["api.py"], ["cli.py", "web.py"], ["a.py", "b.py", "c.py"]):
            client.run_workflow("code-review", args={"files": files}, timeout=60)
        cancelled = client.start_workflow("code-review", args={"files": ["x.py"], "hold": True})
        poll(
            lambda: client.get_workflow_run(cancelled).snapshot["phase"] == "Summarize",
            within=RUN_BOUND,
            what="the hold",
        )
        client.cancel_workflow_run(cancelled, timeout=30)
        held = client.start_workflow(
            "code-review", args={"files": ["engine.py", "client.py", "replay.py", "store.py"], "hold": True}
        )
        poll(
            lambda: client.get_workflow_run(held).snapshot["phase"] == "Summarize",
            within=RUN_BOUND,
            what="the held run",
        )
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 720})
            page.goto(f"{url}/")
            page.wait_for_selector('#live-state[data-state="on"]')
            for box in page.locator('input[name="run_id"]').all()[1:3]:
                box.check()  # two runs selected for a bulk action
            page.screenshot(path=str(DOCS / "web-runs.png"))
            page.goto(f"{url}/ns/default/fleet")
            page.wait_for_selector("#workers")
            page.screenshot(path=str(DOCS / "web-fleet.png"), full_page=True)
            page.set_viewport_size({"width": 1280, "height": 1400})
            page.goto(f"{url}/ns/default/runs/{held}")
            page.wait_for_selector('#live-state[data-state="on"]')
            page.screenshot(path=str(DOCS / "web-run.png"), full_page=True)
            browser.close()
        release.set()
        client.wait_for_workflow_run(held, timeout=30)


if __name__ == "__main__":
    sys.exit(main())
