"""The throttles page and its JSON API (SPEC §5e, §13), and the CLI's
``throttles`` group: settings, holders and waiters as stored."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

from celery_durable import WorkflowContext, workflow
from celery_durable.cli import app
from celery_durable.cli.throttles import parse_rate
from celery_durable.testing import WorkflowTestEnvironment
from celery_durable.web.app import create_app
from tests.web.conftest import Site, SiteFactory
from tests.web.support import csrf_token, serving

expect: Any = pytest.importorskip("playwright.sync_api", reason="playwright is part of the dev extra").expect
expect.set_options(timeout=15_000)


@workflow(name="web-holds", description="Holds its slot until told to go", phases=[])
def _holds(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("go").payload


def test_the_page_and_the_api_show_settings_holders_and_waiters() -> None:
    env = WorkflowTestEnvironment([_holds])
    env.client.set_throttle("emails", concurrency=1, per_key_concurrency=1)
    holder = env.start(_holds, throttle="emails", throttle_key="customer-42")
    waiter = env.start(_holds, throttle="emails", throttle_key="customer-7")
    with TestClient(create_app(env.engine), base_url="http://127.0.0.1") as http:
        page = http.get("/ns/default/throttles")
        assert page.status_code == 200
        assert "emails" in page.text and holder in page.text and waiter in page.text
        listed = http.get("/api/throttles").json()
        assert [(t["name"], t["holding"], t["waiting"]) for t in listed] == [("emails", 1, 1)]
        one = http.get("/api/throttles/emails").json()
        assert [h["run_id"] for h in one["holders"]] == [holder]
        assert [(w["run_id"], w["key"]) for w in one["waiters"]] == [(waiter, "customer-7")]
        assert one["top_keys"] == [{"key": "customer-42", "holding": 1}]
        assert http.get("/api/throttles/nope").status_code == 404


def test_the_cli_sets_shows_lists_and_deletes(monkeypatch: Any) -> None:
    env = WorkflowTestEnvironment([_holds])
    monkeypatch.setattr("celery_durable.cli.throttles.client_for", lambda *_: env.client)
    runner = CliRunner()
    monkeypatch.setenv("CELERY_DURABLE_APP", "unused:engine")
    done = runner.invoke(app, ["throttles", "set", "openai", "--concurrency", "8", "--rate", "500/60", "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["rate"] == [500, 60.0]
    shown = runner.invoke(app, ["throttles", "show", "openai"])
    assert "concurrency=8" in shown.stdout and "rate=500/60s" in shown.stdout
    listed = runner.invoke(app, ["throttles", "list", "--json"])
    assert [t["name"] for t in json.loads(listed.stdout)] == ["openai"]
    bad = runner.invoke(app, ["throttles", "set", "openai", "--concurrency", "0"])
    assert bad.exit_code != 0 and "concurrency must be a positive int" in bad.output
    assert runner.invoke(app, ["throttles", "delete", "openai"]).exit_code == 0
    missing = runner.invoke(app, ["throttles", "show", "openai"])
    assert missing.exit_code != 0 and "No throttle named 'openai'" in missing.output
    assert parse_rate("--rate", "5/0.5") == (5, 0.5)


def test_the_page_sets_and_deletes_under_the_csrf_and_read_only_rules(site: SiteFactory) -> None:
    web = site(worker=False)
    web.client.set_throttle("emails", concurrency=2)
    url = f"/ns/{web.ns}/throttles"
    page = web.http.get(url)
    assert f'action="{url}/emails/set"' in page.text and f'action="{url}/emails/delete"' in page.text
    token = csrf_token(page.text)

    refused = web.http.post(f"{url}/emails/set", data={"concurrency": "9"}, follow_redirects=False)
    assert refused.status_code == 403 and web.client.get_throttle("emails").concurrency == 2
    refused = web.http.post(f"{url}/emails/delete", data={"csrf_token": "stale"}, follow_redirects=False)
    assert refused.status_code == 403 and web.client.get_throttle("emails").concurrency == 2

    changed = web.http.post(
        f"{url}/emails/set", data={"csrf_token": token, "concurrency": "9", "rate": "500/60"}, follow_redirects=False
    )
    assert changed.status_code == 303 and changed.headers["location"] == url
    info = web.client.get_throttle("emails")
    assert (info.concurrency, info.rate, info.per_key_concurrency) == (9, (500, 60.0), None)
    assert "Throttle emails set" in web.http.get(url).text

    created = web.http.post(
        f"{url}/set", data={"csrf_token": token, "name": "openai", "per_key_concurrency": "1"}, follow_redirects=False
    )
    assert created.status_code == 303 and web.client.get_throttle("openai").per_key_concurrency == 1

    wrong = web.http.post(f"{url}/emails/set", data={"csrf_token": token, "concurrency": "0"}, follow_redirects=False)
    assert wrong.status_code == 303 and web.client.get_throttle("emails").concurrency == 9
    assert "concurrency must be a positive int" in web.http.get(url).text
    typo = web.http.post(f"{url}/emails/set", data={"csrf_token": token, "rate": "500"}, follow_redirects=False)
    assert typo.status_code == 303 and "rate takes N/SECONDS" in web.http.get(url).text

    deleted = web.http.post(f"{url}/emails/delete", data={"csrf_token": token}, follow_redirects=False)
    assert deleted.status_code == 303 and [t.name for t in web.client.list_throttles()] == ["openai"]
    assert "Throttle emails deleted" in web.http.get(url).text


def test_read_only_hides_and_refuses_the_throttle_actions(site: SiteFactory) -> None:
    web = site(read_only=True, worker=False)
    web.client.set_throttle("emails", concurrency=2)
    url = f"/ns/{web.ns}/throttles"
    page = web.http.get(url).text
    assert 'data-throttle="emails"' in page and "/emails/set" not in page and "New throttle" not in page
    for path, data in ((f"{url}/emails/delete", {}), (f"{url}/set", {"name": "x", "concurrency": "1"})):
        refused = web.http.post(path, data={"csrf_token": "x", **data}, follow_redirects=False)
        assert refused.status_code == 403
    assert web.http.post("/api/throttles/emails/delete", json={}, headers=same_origin(web)).status_code == 403
    assert [(t.name, t.concurrency) for t in web.client.list_throttles()] == [("emails", 2)]


def same_origin(web: Site) -> dict[str, str]:
    return {"Origin": str(web.http.base_url).rstrip("/")}


def test_the_json_api_sets_and_deletes_with_a_token_or_origin_only(site: SiteFactory) -> None:
    web = site(worker=False)
    assert web.http.post("/api/throttles/openai/set", json={"concurrency": 8}).status_code == 403
    assert web.http.get("/api/throttles/openai").status_code == 404
    made = web.api_post("/api/throttles/openai/set", json={"concurrency": 8, "rate": [500, 60]})
    assert made.status_code == 200 and made.json()["throttle"]["rate"] == [500, 60.0]
    assert web.client.get_throttle("openai").concurrency == 8
    bad = web.api_post("/api/throttles/openai/set", json={"concurrency": -1})
    assert bad.status_code == 400 and "concurrency" in bad.json()["error"]["message"]
    unknown = web.api_post("/api/throttles/openai/set", json={"limit": 3})
    assert unknown.status_code == 400 and web.client.get_throttle("openai").concurrency == 8
    assert web.http.post("/api/throttles/openai/delete", json={}).status_code == 403
    gone = web.http.post("/api/throttles/openai/delete", json={}, headers=same_origin(web))
    assert gone.status_code == 200 and web.client.list_throttles() == []
    assert web.api_post("/api/throttles/openai/delete", json={}).status_code == 404


def test_a_raised_limit_set_from_the_page_in_chromium_lets_a_waiter_go(page: Any) -> None:
    env = WorkflowTestEnvironment([_holds])
    env.client.set_throttle("emails", concurrency=1)
    env.start(_holds, throttle="emails")
    waiter = env.start(_holds, throttle="emails")
    with serving(create_app(env.engine)) as url:
        page.goto(f"{url}/ns/default/throttles")
        section = page.locator('section[data-throttle="emails"]')
        expect(section.locator(f'a[href="/ns/default/runs/{waiter}"]')).to_have_count(1)
        section.locator('form.throttle-set input[name="concurrency"]').fill("2")
        section.locator('button[value="set"]').click()
        expect(page.locator(".notice-ok")).to_contain_text("Throttle emails set")
        env._fleet.drive()
        assert env.get(waiter).status == "running"
        page.locator('section[data-throttle="emails"] button[value="delete"]').click()
        expect(page.locator(".notice-ok")).to_contain_text("Throttle emails deleted")
        expect(page.locator("section.throttle")).to_have_count(0)
