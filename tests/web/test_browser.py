"""The web view in a real browser: headless Chromium (Debian's package) driven
by Playwright, against a real uvicorn server, worker and Redis.

Each test marks the page's ``window`` once loaded and checks the mark at the
end: what it saw arrived without a reload.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.poll import RUN_BOUND, poll
from tests.web.conftest import Site
from tests.web.support import XSS, gate, new_gate

expect: Any = pytest.importorskip("playwright.sync_api", reason="playwright is part of the dev extra").expect
# A loaded 2-core CI machine can take more than the default 5 s to run a step and push it to the page.
expect.set_options(timeout=15_000)



def mark(page: Any) -> None:
    page.evaluate("window.__loaded_once = true")


def still_same_document(page: Any) -> bool:
    return bool(page.evaluate("window.__loaded_once === true"))


def wait_live(page: Any) -> None:
    expect(page.locator("#live-state")).to_have_attribute("data-state", "on")


def test_the_runs_page_lists_a_fresh_run(live: tuple[Site, str], page: Any) -> None:
    web, url = live
    page.goto(f"{url}/")
    expect(page.locator("h1")).to_have_text("Runs")
    wait_live(page)
    mark(page)
    run_id = web.client.start_workflow("web.quick")
    row = page.locator(f'tr[data-run-id="{run_id}"]')
    expect(row).to_be_visible()
    expect(row.locator(".status")).to_have_text("completed")
    assert still_same_document(page)


def test_the_run_page_shows_a_phase_change_and_a_log_line_live(live: tuple[Site, str], page: Any) -> None:
    web, url = live
    first, second = new_gate(), new_gate()
    run_id = web.client.start_workflow(
        "web.gated", args={"first": first, "second": second, "line": "through the gate, live"}
    )
    poll(
        lambda: web.client.get_workflow_run(run_id).snapshot["steps_running"],
        within=RUN_BOUND,
        what="the held step",
    )
    page.goto(f"{url}/ns/default/runs/{run_id}")
    expect(page.locator('[data-phase-id="phase-1"]')).to_have_attribute("data-state", "active")
    expect(page.locator('[data-phase-id="phase-2"]')).to_have_attribute("data-state", "pending")
    wait_live(page)
    mark(page)

    gate(first).set()
    expect(page.locator("#records .message", has_text="through the gate, live")).to_be_visible()
    expect(page.locator('[data-phase-id="phase-2"]')).to_have_attribute("data-state", "active")
    expect(page.locator('[data-phase-id="phase-1"]')).to_have_attribute("data-state", "done")
    expect(page.locator("#run-phase")).to_have_text("Work")
    assert still_same_document(page)
    gate(second).set()
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#result")).to_contain_text('"done": true')
    assert still_same_document(page)


def test_cancel_from_the_page_ends_the_run_cancelled(live: tuple[Site, str], page: Any) -> None:
    web, url = live
    run_id = web.client.start_workflow("web.gated", args={"first": new_gate()})
    poll(
        lambda: web.client.get_workflow_run(run_id).snapshot["steps_running"],
        within=RUN_BOUND,
        what="the held step",
    )
    page.goto(f"{url}/ns/default/runs/{run_id}")
    page.locator("#cancel-button").click()
    expect(page.locator(".notice-ok")).to_be_visible()
    expect(page.locator("#run-status")).to_have_text("cancelled")
    expect(page.locator("#actions")).to_have_count(0)
    assert web.client.get_workflow_run(run_id).status == "cancelled"


def test_markup_in_a_log_line_renders_as_text(live: tuple[Site, str], page: Any) -> None:
    web, url = live
    held = new_gate()
    run_id = web.client.start_workflow("web.hostile", args={"hold": held})
    poll(
        lambda: web.client.get_workflow_run(run_id).snapshot["steps_running"],
        within=RUN_BOUND,
        what="the held step",
    )
    page.goto(f"{url}/ns/default/runs/{run_id}")
    expect(page.locator("#records .message", has_text=XSS).first).to_be_visible()  # rendered by the server
    wait_live(page)
    mark(page)
    gate(held).set()
    expect(page.locator("#records .message", has_text="live " + XSS)).to_be_visible()  # appended by the script
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#result")).to_contain_text("<script>window.__xss=1</script><img src=x")
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.locator("#records img, #result img, #steps img").count() == 0
    assert still_same_document(page)
