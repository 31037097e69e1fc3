"""The schedules page (SPEC §5d, §13): settings, next ticks, recent actions
linked to their runs, and pause/unpause/trigger under the same CSRF and
read-only rules as every action; the JSON API mirrors it. In Chromium too."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.poll import RUN_BOUND, poll
from tests.web.conftest import Site, SiteFactory
from tests.web.support import csrf_token

expect: Any = pytest.importorskip("playwright.sync_api", reason="playwright is part of the dev extra").expect
expect.set_options(timeout=15_000)


def page_url(web: Site) -> str:
    return f"/ns/{web.ns}/schedules"


def test_the_page_shows_settings_and_next_ticks_and_its_forms_act(site: SiteFactory) -> None:
    web = site()
    web.client.create_schedule("nightly", "web.quick", cron="0 2 * * *", timezone="Europe/Paris", note="reports")
    page = web.http.get(page_url(web))
    assert page.status_code == 200
    assert 'data-schedule="nightly"' in page.text and "0 2 * * *" in page.text and "Europe/Paris" in page.text
    assert page.text.count('class="next"') == 5 and "reports" in page.text
    token = csrf_token(page.text)

    refused = web.http.post(f"{page_url(web)}/nightly/pause", data={}, follow_redirects=False)
    assert refused.status_code == 403 and not web.client.get_schedule("nightly").paused

    paused = web.http.post(f"{page_url(web)}/nightly/pause", data={"csrf_token": token}, follow_redirects=False)
    assert paused.status_code == 303 and web.client.get_schedule("nightly").paused
    assert "paused" in web.http.get(paused.headers["location"]).text

    triggered = web.http.post(f"{page_url(web)}/nightly/trigger", data={"csrf_token": token}, follow_redirects=False)
    shown = web.http.get(triggered.headers["location"]).text
    (run_id,) = [item["run_id"] for item in web.client.get_schedule("nightly").recent]
    assert f"Run {run_id} started." in shown and f'href="/ns/{web.ns}/runs/{run_id}"' in shown
    assert web.client.wait_for_workflow_run(run_id, timeout=20).schedule_id == "nightly"
    runs = web.http.get(f"/ns/{web.ns}/?schedule=nightly").text
    assert run_id in runs


def test_read_only_hides_and_refuses_the_actions(site: SiteFactory) -> None:
    web = site(read_only=True)
    web.client.create_schedule("s", "web.quick", every=3600)
    page = web.http.get(page_url(web)).text
    assert 'data-schedule="s"' in page and "/schedules/s/pause" not in page
    refused = web.http.post(f"{page_url(web)}/s/pause", data={"csrf_token": "x"}, follow_redirects=False)
    assert refused.status_code == 403 and not web.client.get_schedule("s").paused


def test_the_json_api_mirrors_the_client(site: SiteFactory) -> None:
    web = site()
    web.client.create_schedule("s", "web.quick", every=3600)
    listed = web.http.get("/api/schedules").json()
    assert [s["schedule_id"] for s in listed["schedules"]] == ["s"]
    assert web.http.get("/api/schedules/s").json()["every"] == 3600
    assert web.http.get("/api/schedules/nope").status_code == 404
    assert web.http.post("/api/schedules/s/pause", json={}).status_code == 403  # no token, no Origin
    paused = web.api_post("/api/schedules/s/pause", json={})
    assert paused.status_code == 200 and paused.json()["schedule"]["paused"] is True
    triggered = web.api_post("/api/schedules/s/trigger", json={}).json()
    assert triggered["run_id"] and triggered["schedule"]["recent"][0]["run_id"] == triggered["run_id"]



def test_pause_and_trigger_from_the_page_in_chromium(live: tuple[Site, str], page: Any) -> None:
    web, url = live
    web.client.create_schedule("hourly", "web.quick", cron="0 * * * *")
    page.goto(f"{url}/ns/{web.ns}/schedules")
    section = page.locator('section[data-schedule="hourly"]')
    expect(section.locator("time.next")).to_have_count(5)
    section.locator('button[value="pause"]').click()
    expect(page.locator(".notice-ok")).to_contain_text("paused")
    expect(page.locator('section[data-schedule="hourly"]')).to_have_attribute("data-paused", "yes")
    page.locator('section[data-schedule="hourly"] button[value="trigger"]').click()
    expect(page.locator(".notice-ok")).to_contain_text("started")
    recent = poll(lambda: web.client.get_schedule("hourly").recent, within=RUN_BOUND, what="the trigger's action")
    run_id = recent[0]["run_id"]
    page.locator(f'a[href="/ns/{web.ns}/runs/{run_id}"]').click()
    expect(page.locator("#run-status")).to_be_visible()
