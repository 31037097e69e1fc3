"""The runs page's search and a bulk action in a real browser: headless
Chromium against a real uvicorn server, worker and Redis."""

from __future__ import annotations

from typing import Any

import pytest

from tests.web.conftest import Site, held

expect: Any = pytest.importorskip("playwright.sync_api", reason="playwright is part of the dev extra").expect
expect.set_options(timeout=15_000)




def test_search_by_workflow_and_status_from_the_form(live: tuple[Site, str], page: Any) -> None:
    web, url = live
    quick = web.client.run_workflow("web.quick", timeout=20).run_id
    gated = held(web)
    page.goto(f"{url}/")
    expect(page.locator(f'tr[data-run-id="{quick}"]')).to_be_visible()
    page.select_option('#search select[name="workflow"]', "web.gated")
    page.select_option('#search select[name="status"]', "running")
    page.locator('#search button[type="submit"]').click()
    expect(page.locator(f'tr[data-run-id="{gated}"]')).to_be_visible()
    expect(page.locator(f'tr[data-run-id="{quick}"]')).to_have_count(0)
    assert "workflow=web.gated" in page.url and "status=running" in page.url


def test_select_runs_and_cancel_them_in_bulk(live: tuple[Site, str], page: Any) -> None:
    web, url = live
    first, second = held(web), held(web)
    untouched = held(web)
    page.goto(f"{url}/")
    expect(page.locator("#bulk-cancel")).to_be_disabled()  # nothing selected yet
    page.locator(f'tr[data-run-id="{first}"] input[type="checkbox"]').check()
    page.locator(f'tr[data-run-id="{second}"] input[type="checkbox"]').check()
    expect(page.locator("#bulk-count")).to_have_text("2 selected:")
    web.client.run_workflow("web.quick", timeout=20)  # a change: the rows are fetched again, the selection stays
    expect(page.locator(f'tr[data-run-id="{first}"] input[type="checkbox"]')).to_be_checked()
    page.locator("#bulk-cancel").click()

    expect(page.locator("h1")).to_have_text("Cancel 2 runs?")
    expect(page.locator("#bulk-selection tbody tr")).to_have_count(2)
    assert web.client.get_workflow_run(first).status == "running"  # nothing done before the confirmation
    page.locator("#bulk-confirm").click()

    expect(page.locator("h1")).to_have_text("Cancel: 2 of 2 runs done")
    for run_id in (first, second):
        expect(page.locator(f'#bulk-results tr[data-run-id="{run_id}"]')).to_have_attribute("data-ok", "yes")
        assert web.client.wait_for_workflow_run(run_id, timeout=20).status == "cancelled"
    assert web.client.get_workflow_run(untouched).status == "running"
