"""What a reader sees on a run's page (issue 40): times as every time on the
pages reads, an event number instead of a seq nobody can read, no Resume on
a healthy run, and how many children a run waits for."""

from __future__ import annotations

import re
from typing import Any

from starlette.testclient import TestClient

from celery_durable import WorkflowContext, workflow
from celery_durable.testing import WorkflowTestEnvironment
from celery_durable.web import create_app

RAW_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")


@workflow(name="read.kid", description="Waits for go", phases=[])
def kid(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("go").payload


@workflow(name="read.family", description="Waits for three children", phases=[])
def family(ctx: WorkflowContext) -> Any:
    ctx.step("first", lambda: 1)
    return ctx.parallel([lambda i=i: ctx.child(f"kid-{i}", kid) for i in range(3)])


@workflow(name="read.napper", description="Sleeps a minute", phases=[])
def napper(ctx: WorkflowContext) -> Any:
    ctx.sleep(60)
    return "rested"


@workflow(name="read.metered", description="Holds its slot until told", phases=[])
def metered(ctx: WorkflowContext) -> Any:
    return ctx.wait_for_signal("go").payload


def visible(html: str) -> str:
    """The page's text as a reader sees it: no tags, no attribute values."""
    body = re.sub(r"<script.*?</script>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))


SINCE = r" since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
"""How the waiting line ends: when the wait began (SPEC §13)."""


def waiting_line(html: str) -> str:
    found = re.search(r'<p id="waiting"[^>]*>(.*?)</p>', html, flags=re.S)
    assert found, "the page says what the run waits for"
    return visible(found[1]).strip()


def page(env: WorkflowTestEnvironment, run_id: str) -> str:
    with TestClient(create_app(env.engine), base_url="http://127.0.0.1") as http:
        answer = http.get(f"/ns/default/runs/{run_id}")
        assert answer.status_code == 200
        return answer.text


def test_a_run_waiting_for_three_children_says_three() -> None:
    env = WorkflowTestEnvironment([family, kid])
    run_id = env.start(family)
    children = env.client.get_workflow_run_detail(run_id).children
    assert len(children) == 3
    line = waiting_line(page(env, run_id))
    assert line.startswith("Waiting for 3 child runs"), line
    assert not any(child.run_id in line for child in children), "not one of them, as if it were the only one"
    for child in children[:2]:
        env.signal(child.run_id, "go", 1)
    assert env.get(run_id).status == "running"
    line = waiting_line(page(env, run_id))
    assert re.fullmatch(f"Waiting for the child run {children[2].run_id}{SINCE} · open it", line), line


def test_a_waiting_run_says_since_when_it_waits() -> None:
    """SPEC §13: for a run that waits, what it waits for and since when: the
    time of the wait's ``wait_started`` event, once more after a second wait."""
    env = WorkflowTestEnvironment([metered])
    run_id = env.start(metered)
    started = [e for e in env.client.get_workflow_run_history(run_id).events if e.kind == "wait_started"]
    assert len(started) == 1
    html = page(env, run_id)
    assert waiting_line(html) == f"Waiting for the signal go since {started[0].at:%Y-%m-%d %H:%M:%S} UTC"
    assert f'<time id="waiting-since" datetime="{started[0].at.isoformat()}">' in html
    env.signal(run_id, "go", 1)
    assert "waiting-since" not in page(env, run_id), "a settled run waits for nothing"


def test_times_read_as_the_other_times_and_events_are_numbered_for_a_reader() -> None:
    env = WorkflowTestEnvironment([napper])
    run_id = env.start(napper)
    html = page(env, run_id)
    due = env.get(run_id).snapshot["waiting_for"]["until"]
    assert RAW_ISO.match(str(due)), "the snapshot keeps ISO 8601 for scripts"
    line = waiting_line(html)
    assert re.fullmatch(r"Waiting for a timer \(until \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)" + SINCE, line), line
    assert not RAW_ISO.search(visible(html)), RAW_ISO.search(visible(html))
    header = re.search(r"<thead><tr>(.*?)</tr></thead>", html.split('id="history"', 1)[1], flags=re.S)
    assert header and visible(header[1]).split()[0] == "#" and "Seq" not in header[1]
    numbers = re.findall(r'<tr class="event[^"]*" data-seq="(\d+)"', html)
    assert sorted(map(int, numbers)) == list(range(1, len(numbers) + 1)), numbers


def test_a_healthy_run_offers_no_resume_and_a_paused_one_does() -> None:
    env = WorkflowTestEnvironment([napper])
    run_id = env.start(napper)
    running = page(env, run_id)
    assert env.get(run_id).status == "running" and not env.get(run_id).can_resume
    assert 'id="resume-button"' not in running
    # Taking over a live attempt stays possible, out of the way, and says when it is for.
    takeover = running.split('id="take-over"', 1)[1].split("</details>", 1)[0]
    assert "Stuck? Take over this attempt" in takeover and 'name="force" value="1"' in takeover
    env.pause(run_id)
    paused = page(env, run_id)
    assert env.get(run_id).can_resume and 'id="resume-button"' in paused and 'id="take-over"' not in paused


def test_a_run_waiting_for_a_throttle_names_it() -> None:
    env = WorkflowTestEnvironment([metered])
    env.client.set_throttle("api", concurrency=1)
    env.start(metered, throttle="api")
    waiter = env.start(metered, throttle="api")
    assert re.fullmatch("Waiting for a slot of the throttle api" + SINCE, waiting_line(page(env, waiter)))
