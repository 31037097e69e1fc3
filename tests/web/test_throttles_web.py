"""The throttles page and its JSON API (SPEC §5e, §13), and the CLI's
``throttles`` group: settings, holders and waiters as stored."""

from __future__ import annotations

import json
from typing import Any

from starlette.testclient import TestClient
from typer.testing import CliRunner

from celery_durable import WorkflowContext, workflow
from celery_durable.cli import app
from celery_durable.cli.throttles import parse_rate
from celery_durable.testing import WorkflowTestEnvironment
from celery_durable.web.app import create_app


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
