"""The run's history on the web: the JSON API, the run page's panels, the history pages."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from celery_durable import FunctionRunner, WorkflowContext, workflow
from celery_durable.testing import WorkflowTestEnvironment
from celery_durable.web import create_app
from celery_durable.workflows.calls import call_task_id
from tests.support.poll import RUN_BOUND, poll
from tests.web.conftest import Site, SiteFactory
from tests.web.support import gate, new_gate

expect: Any = pytest.importorskip("playwright.sync_api", reason="playwright is part of the dev extra").expect
expect.set_options(timeout=15_000)

UNKNOWN = "0" * 32


def test_the_api_mirrors_the_client_and_gives_values_whole(site: SiteFactory) -> None:
    web = site()
    run = web.client.run_workflow("web.quick", args={"lines": 2}, timeout=20)
    whole = web.http.get(f"/api/runs/{run.run_id}/history")
    assert whole.status_code == 200
    assert whole.json() == web.client.get_workflow_run_history(run.run_id).to_dict()
    events = whole.json()["events"]
    assert events[0]["kind"] == "attempt_started" and events[-1]["kind"] == "run_settled"
    step = next(event for event in events if event["kind"] == "step_completed")
    assert (step["key"], step["data"]["result"], step["data"]["value_ref"]) == ("answer", 42, "v:answer")

    first = web.http.get(f"/api/runs/{run.run_id}/history", params={"limit": 1}).json()
    rest = web.http.get(f"/api/runs/{run.run_id}/history", params={"after": first["next"]}).json()
    assert first["events"] + rest["events"] == events and rest["next"] is None

    value = web.http.get(f"/api/runs/{run.run_id}/value", params={"ref": "v:answer"})
    assert value.status_code == 200 and value.json() == {"ref": "v:answer", "value": 42}
    assert web.http.get(f"/api/runs/{run.run_id}/value", params={"ref": "v:nothing"}).status_code == 404
    assert web.http.get(f"/api/runs/{run.run_id}/value", params={"ref": "o:m:0"}).status_code == 400
    assert web.http.get(f"/api/runs/{UNKNOWN}/value", params={"ref": "v:answer"}).status_code == 404
    assert web.http.get(f"/api/runs/{UNKNOWN}/history").status_code == 404
    for bad in ({"limit": "0"}, {"limit": "501"}, {"after": "-1"}, {"after": "x"}):
        answer = web.http.get(f"/api/runs/{run.run_id}/history", params=bad)
        assert answer.status_code == 400, bad
        assert answer.json()["error"]["message"]


def test_the_run_page_shows_history_timeline_start_times_and_code(site: SiteFactory) -> None:
    web = site()
    run = web.client.run_workflow("web.quick", timeout=20)
    text = web.http.get(web.run_url(run.run_id)).text
    assert 'id="history-events"' in text and 'data-kind="step_completed"' in text
    assert f'href="/api/runs/{run.run_id}/value?ref=v%3Aanswer"' in text
    assert 'id="timeline-svg"' in text and 'data-label="answer"' in text
    detail = web.client.get_workflow_run_detail(run.run_id)
    assert detail.started_code_hash[:12] in text
    assert "No agent turns." in text and "No agent turn yet." not in text

    pages = web.http.get(f"/ns/default/runs/{run.run_id}/history")
    assert pages.status_code == 200 and 'data-kind="run_settled"' in pages.text and 'id="next-page"' not in pages.text
    assert web.http.get(f"/ns/default/runs/{run.run_id}/history", params={"after": "x"}).status_code == 400


@workflow(name="web-inputs", description="a step and two calls", phases=[])
def _calls(ctx: WorkflowContext) -> Any:
    ctx.step("plain", lambda: 1)
    ctx.call("resize", "fleet.resize", args=("a.png",), kwargs={"width": 3})
    return ctx.call("bulk", "fleet.resize", args=("x" * 2000,))


def test_the_steps_table_shows_each_calls_inputs_and_the_value_endpoint_gives_them_whole() -> None:
    env = WorkflowTestEnvironment([_calls], tasks={"fleet.resize": lambda url, width=1: len(url) * width})
    run_id = env.run(_calls).run_id
    with TestClient(create_app(env.engine), base_url="http://127.0.0.1") as http:
        text = http.get(f"/ns/default/runs/{run_id}").text
        rows = {row.split("</td>", 1)[0]: row for row in text.split('<tr><td class="mono">')[1:]}
        assert "{&#34;args&#34;:[&#34;a.png&#34;],&#34;kwargs&#34;:{&#34;width&#34;:3}}" in rows["resize"]
        assert f'href="/api/runs/{run_id}/value?ref=i%3Aresize"' in rows["resize"]
        assert "…" in rows["bulk"] and "x" * 2000 not in rows["bulk"]
        assert "value?ref=" not in rows["plain"] and "takes no arguments" in rows["plain"]
        whole = http.get(f"/api/runs/{run_id}/value", params={"ref": "i:bulk"})
        assert whole.json() == {"ref": "i:bulk", "value": {"args": ["x" * 2000], "kwargs": {}}}
        assert http.get(f"/api/runs/{run_id}/value", params={"ref": "i:plain"}).status_code == 404


@workflow(name="web-flower", description="a step, a call and an agent turn", phases=[])
def _tasks(ctx: WorkflowContext) -> Any:
    ctx.step("plain", lambda: 1)
    ctx.call("resize", "fleet.resize", args=("a.png",))
    return ctx.agent("Review a.png", label="reviewer")


def test_given_a_flower_url_task_rows_link_to_flowers_task_pages() -> None:
    """SPEC §13: a call's row links its task (its id derived from the run and the key), an
    agent turn's row the task that ran it; a plain step runs in no task of its own."""
    env = WorkflowTestEnvironment(
        [_tasks], tasks={"fleet.resize": lambda url: len(url)}, agent_runner=FunctionRunner(default=lambda r: "ok")
    )
    run_id = env.run(_tasks).run_id
    detail = env.client.get_workflow_run_detail(run_id)
    [agent] = detail.agents
    assert isinstance(agent["task_id"], str) and agent["task_id"]
    task_ids = {step.key: step.task_id for step in detail.steps}
    assert task_ids == {"plain": None, "resize": call_task_id(run_id, "resize")}
    flower = "http://flower.example:5555"
    with TestClient(create_app(env.engine, flower_url=flower), base_url="http://127.0.0.1") as http:
        text = http.get(f"/ns/default/runs/{run_id}").text
    steps = {row.split("</td>", 1)[0]: row for row in text.split('<tr><td class="mono">')[1:]}
    assert f'href="{flower}/task/{call_task_id(run_id, "resize")}"' in steps["resize"]
    assert f"{flower}/task/" not in steps["plain"]
    assert f'href="{flower}/task/{agent["task_id"]}"' in text
    with TestClient(create_app(env.engine), base_url="http://127.0.0.1") as http:
        assert "flower.example" not in http.get(f"/ns/default/runs/{run_id}").text


def test_started_names_the_first_attempt_that_started(site: SiteFactory) -> None:
    """A run whose first attempt never ran (its message waits for a worker
    that never came) and that was taken over shows when attempt 2 started,
    and says so, not the run's first start (there was none) nor a resume time."""
    idle = site(worker=False)
    run_id = idle.client.start_workflow("web.quick", args={"lines": 1})
    with pytest.raises(TimeoutError):
        idle.client.resume_workflow(run_id, force=True, timeout=0.05)
    web = site()  # a worker: attempt 1's message is refused as stale, attempt 2 runs
    web.client.wait_for_workflow_run(run_id, timeout=20)
    story = web.client.get_workflow_run_history(run_id).events
    started = [event for event in story if event.kind == "attempt_started"]
    assert [event.attempt for event in started] == [2]
    text = web.http.get(web.run_url(run_id)).text
    shown = text.split('id="run-started">', 1)[1].split("</dd>", 1)[0]
    assert shown.endswith("(attempt 2; no earlier attempt started)"), shown



def test_history_and_timeline_grow_live_in_the_browser(live: tuple[Site, str], page: Any) -> None:
    web, url = live
    first, second = new_gate(), new_gate()
    run_id = web.client.start_workflow("web.gated", args={"first": first, "second": second, "line": "on"})
    poll(
        lambda: web.client.get_workflow_run(run_id).snapshot["steps_running"],
        within=RUN_BOUND,
        what="the held step",
    )
    page.goto(f"{url}/ns/default/runs/{run_id}")
    expect(page.locator('#history-events tr[data-kind="attempt_started"]')).to_have_count(1)
    expect(page.locator("#live-state")).to_have_attribute("data-state", "on")
    page.evaluate("window.__loaded_once = true")
    gate(first).set()
    gate(second).set()
    expect(page.locator('#history-events tr[data-kind="run_settled"]')).to_have_count(1)
    expect(page.locator('#history-events tr[data-kind="step_completed"]').first).to_be_visible()
    expect(page.locator("#timeline-svg g.bar-step").first).to_be_attached()
    rows = page.locator("#history-events tr.event")
    seqs = [int(seq) for seq in rows.evaluate_all("rows => rows.map(r => r.dataset.seq)")]
    assert seqs == sorted(seqs)
    assert page.evaluate("window.__loaded_once === true")  # it came live, no reload

    page.locator("#whole-history").click()
    expect(page.locator("#history-events tr.event").first).to_have_attribute("data-kind", "attempt_started")
    link = page.locator("#history-events a.value-link").first
    href = link.get_attribute("href")
    assert href is not None and web.http.get(href).status_code == 200


@workflow(name="web-packing", description="a child that waits", phases=[])
def packing(ctx: WorkflowContext) -> Any:
    ctx.wait_for_signal("packed")
    return "P-1"


@workflow(name="web-fulfil", description="a child wait, then a signal wait", phases=[])
def fulfil(ctx: WorkflowContext) -> Any:
    parcel = ctx.child("pack", packing)
    return [parcel, ctx.wait_for_signal("approval").payload]


def test_the_timeline_draws_a_child_wait_and_a_signal_wait_from_their_start_to_their_end() -> None:
    from celery_durable.client import history
    from celery_durable.web.timeline import bars

    env = WorkflowTestEnvironment([fulfil, packing])
    run_id = env.start(fulfil)
    child = env.client.get_workflow_run_detail(run_id).children[0].run_id
    env.clock.advance(20)
    env.signal(child, "packed")
    env.clock.advance(30)

    def waits() -> dict[str, Any]:
        detail = env.client.get_workflow_run_detail(run_id)
        events = history.newest(env.engine.store, run_id, 200, previews=False).events
        return {bar.label: bar for bar in bars(detail, events) if bar.kind == "wait"}

    drawn = waits()
    assert set(drawn) == {"child pack", "signal approval"}
    assert 20 <= (drawn["child pack"].end - drawn["child pack"].start).total_seconds() < 21
    assert drawn["signal approval"].end is None and drawn["signal approval"].status == "running"
    env.signal(run_id, "approval", "ok")
    assert 30 <= (waits()["signal approval"].end - drawn["signal approval"].start).total_seconds() < 31


@workflow(name="web.gated", description="Holds its slot until told", phases=[])
def gated(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("go").payload


@workflow(name="web.metered", description="One throttled step", phases=[])
def metered(ctx: WorkflowContext) -> Any:
    return ctx.step("call-api", lambda: 1, throttle="api")


def test_the_timeline_draws_throttle_waits_until_their_slot_came() -> None:
    from celery_durable.client import history
    from celery_durable.web.timeline import bars

    env = WorkflowTestEnvironment([gated, metered])
    env.client.set_throttle("t", concurrency=1)
    env.client.set_throttle("api", concurrency=1)
    holder = env.start(gated, throttle="t")
    waiter = env.start(gated, throttle="t")
    api_holder = env.start(gated, throttle="api")
    stepper = env.start(metered)
    env.clock.advance(20)
    env.signal(holder, "go")
    env.signal(api_holder, "go")

    def waits(run_id: str) -> dict[str, Any]:
        detail = env.client.get_workflow_run_detail(run_id)
        events = history.newest(env.engine.store, run_id, 200, previews=False).events
        return {bar.label: bar for bar in bars(detail, events) if bar.kind == "wait"}

    run_slot = waits(waiter)["throttle t"]
    assert 20 <= (run_slot.end - run_slot.start).total_seconds() < 21 and run_slot.status == "completed"
    step_slot = waits(stepper)["throttle call-api"]
    assert 20 <= (step_slot.end - step_slot.start).total_seconds() < 21
