"""Pictures of issue 40: ``python -m tests.web.history_screenshots``.

Starts a private Redis, two worker processes of two deploys of ``order``
(``tests/support/apps/versioned.py``: v1 and v2, a mixed deploy), an in-process
worker and the web view; runs a workflow that waits for a child and then
for a signal; and has headless Chromium save ``docs/web-fleet-mixed.png``
(the fleet page naming the mixed deploy) and ``docs/web-run-waits.png`` (a
run page whose timeline draws the child wait and the signal wait). The
short pauses only spread the waits out for the picture; every step of the
script waits for the state it needs.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from celery_durable import Engine, Settings, WorkflowContext, workflow
from celery_durable.local.redis_server import RedisServer
from celery_durable.web import create_app
from tests.conftest import worker_thread
from tests.support.apps.versioned import ORDER
from tests.support.fleet import Fleet
from tests.support.poll import RUN_BOUND, poll
from tests.web.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.web.support import serving

DOCS = Path(__file__).resolve().parents[2] / "docs"
SPREAD = 1.5
"""Seconds each wait is left waiting, so that its bar is wide enough to see."""


@workflow(name="packing", description="Packs an order, once the warehouse says so", phases=[{"title": "Pack"}])
def packing(ctx: WorkflowContext) -> Any:
    ctx.phase("Pack")
    ctx.wait_for_signal("packed")
    return ctx.step("label", lambda: {"parcel": "P-1"})


@workflow(
    name="fulfil",
    description="Reserves, packs in a child run, waits for approval, ships",
    phases=[{"title": "Reserve"}, {"title": "Pack"}, {"title": "Approve"}, {"title": "Ship"}],
)
def fulfil(ctx: WorkflowContext) -> Any:
    ctx.phase("Reserve")
    ctx.step("reserve", lambda: "reserved")
    ctx.phase("Pack")
    parcel = ctx.child("pack", packing)
    ctx.phase("Approve")
    approval = ctx.wait_for_signal("approval")
    ctx.phase("Ship")
    return ctx.step("ship", lambda: {"parcel": parcel, "approved": approval.payload})


def waiting_for(client: Any, run_id: str, kind: str) -> bool:
    waiting = client.get_workflow_run(run_id).snapshot["waiting_for"] or {}
    return bool(waiting.get("kind") == kind)


def main() -> int:
    tag = uuid.uuid4().hex[:8]
    with RedisServer() as redis_server, tempfile.TemporaryDirectory() as logs:
        settings = Settings(
            redis_url=redis_server.url, key_prefix=f"shot{tag}", coordinator_queue=f"shot{tag}.c",
            steps_queue=f"shot{tag}.s", agents_queue=f"shot{tag}.a",
        )
        fleet = Fleet(settings, Path(logs))
        try:
            fleet.start("tests.support.apps.versioned:v1", name="orders-old")
            fleet.start("tests.support.apps.versioned:v2", name="orders-new")
            engine = Engine([fulfil, packing, ORDER["v2"]], settings)
            shoot(engine, engine.client())
        finally:
            fleet.close()
    print(f"wrote {DOCS / 'web-fleet-mixed.png'} and {DOCS / 'web-run-waits.png'}")
    return 0


def shoot(engine: Engine, client: Any) -> None:
    with worker_thread(engine), serving(create_app(engine)) as url:
        run_id = client.start_workflow("fulfil")
        poll(lambda: waiting_for(client, run_id, "child"), within=RUN_BOUND, what="the child wait")
        child = client.get_workflow_run_detail(run_id).children[0].run_id
        poll(lambda: waiting_for(client, child, "signal"), within=RUN_BOUND, what="the child's own wait")
        time.sleep(SPREAD)
        client.signal_workflow_run(child, "packed")
        poll(lambda: waiting_for(client, run_id, "signal"), within=RUN_BOUND, what="the approval wait")
        time.sleep(SPREAD)
        poll(
            lambda: len([w for w in client.list_workers() if w.alive and w.workflows]) >= 3,
            within=RUN_BOUND,
            what="reports",
        )
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{url}/ns/default/fleet")
            page.wait_for_selector(".mixed-deploy")
            page.screenshot(path=str(DOCS / "web-fleet-mixed.png"), full_page=True)
            page.set_viewport_size({"width": 1280, "height": 1400})
            page.goto(f"{url}/ns/default/runs/{run_id}")
            page.wait_for_selector('#timeline-svg g[data-kind="wait"]')
            page.screenshot(path=str(DOCS / "web-run-waits.png"), full_page=True)
            browser.close()
        client.signal_workflow_run(run_id, "approval", {"by": "ops"})
        client.wait_for_workflow_run(run_id, timeout=30)


if __name__ == "__main__":
    sys.exit(main())
