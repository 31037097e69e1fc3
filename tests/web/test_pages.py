"""The pages and the JSON API over HTTP, against a real engine, worker and Redis."""

from __future__ import annotations

import html

from celery_durable.broker.schema import child_run_id
from tests.support.poll import RUN_BOUND, poll
from tests.web.conftest import SiteFactory
from tests.web.support import gate, new_gate

UNKNOWN = "0" * 32


def test_root_redirects_to_the_namespace_and_the_runs_page_lists_runs(site: SiteFactory) -> None:
    web = site()
    done = web.client.run_workflow("web.quick", timeout=20)
    held = new_gate()
    running = web.client.start_workflow("web.gated", args={"first": held})
    poll(
        lambda: web.client.get_workflow_run(running).status == "running",
        within=RUN_BOUND,
        what="the gated run to start",
    )

    root = web.http.get("/", follow_redirects=False)
    assert root.status_code == 302 and root.headers["location"] == "/ns/default/"
    page = web.http.get("/ns/default/")
    assert page.status_code == 200
    assert f'href="/ns/default/runs/{done.run_id}"' in page.text
    assert f'href="/ns/default/runs/{running}"' in page.text
    assert "status-completed" in page.text and "status-running" in page.text
    assert "Prepare" in page.text  # the running run's phase

    completed = web.http.get("/ns/default/", params={"status": "completed"})
    assert done.run_id in completed.text and running not in completed.text
    by_workflow = web.http.get("/ns/default/rows", params={"workflow": "web.gated"})
    assert running in by_workflow.text and done.run_id not in by_workflow.text
    assert by_workflow.text.lstrip().startswith('<div id="runs-live"')  # the fragment alone
    gate(held).set()


def test_runs_page_pages_through_the_clients_cursor(site: SiteFactory) -> None:
    web = site(worker=False)  # records only: nothing has to run
    ids = [web.client.start_workflow("web.quick") for _ in range(55)]
    first = web.http.get("/ns/default/")
    assert sum(run_id in first.text for run_id in ids) == 50
    assert ids[-1] in first.text and ids[0] not in first.text  # newest first
    older = html.unescape(first.text.split('rel="next" href="', 1)[1].split('"', 1)[0])
    second = web.http.get(older)
    assert sum(run_id in second.text for run_id in ids) == 5 and ids[0] in second.text
    assert 'rel="next"' not in second.text


def test_run_page_shows_phases_steps_progress_and_result(site: SiteFactory) -> None:
    web = site()
    run = web.client.run_workflow("web.quick", args={"lines": 3}, timeout=20)
    page = web.http.get(web.run_url(run.run_id))
    assert page.status_code == 200
    text = page.text
    assert 'class="phase phase-done"' in text and ">Only<" in text
    assert 'class="mono">answer<' in text  # the step's key, in the steps table
    assert "line 1" in text and "line 3" in text
    assert 'id="result">42<' in text
    assert 'id="actions"' not in text  # a completed run has no buttons


def test_run_page_says_what_a_running_run_is_doing(site: SiteFactory) -> None:
    web = site()
    held = new_gate()
    run_id = web.client.start_workflow("web.gated", args={"first": held})
    poll(
        lambda: web.client.get_workflow_run(run_id).snapshot["steps_running"],
        within=RUN_BOUND,
        what="the held step",
    )
    text = web.http.get(web.run_url(run_id)).text
    assert 'data-phase-id="phase-1" data-state="active"' in text
    assert 'data-phase-id="phase-2" data-state="pending"' in text
    assert "status-running" in text and 'id="actions"' in text
    live = web.http.get(web.run_url(run_id) + "/live")
    assert live.text.lstrip().startswith('<div id="run-live"') and "Prepare" in live.text
    gate(held).set()


def test_a_run_page_links_its_parent_and_its_children(site: SiteFactory) -> None:
    web = site()
    parent = web.client.start_workflow("web.parent")
    kid = child_run_id(parent, "kid")
    poll(
        lambda: web.client.get_workflow_run(parent).snapshot["waiting_for"],
        within=RUN_BOUND,
        what="the parent to wait",
    )
    text = web.http.get(web.run_url(parent)).text
    assert f"Waiting for the child run {kid}" in text
    assert f'href="/ns/default/runs/{kid}">open it</a>' in text
    assert 'id="children"' in text and f'class="child-link" href="/ns/default/runs/{kid}"' in text
    assert ">web.waits-for-go<" in text and 'id="parent-link"' not in text

    child_page = web.http.get(web.run_url(kid)).text
    assert f'id="parent-link" href="/ns/default/runs/{parent}"' in child_page
    assert 'id="children"' not in child_page
    poll(
        lambda: web.client.get_workflow_run(kid).snapshot["waiting_for"],
        within=RUN_BOUND,
        what="the child to wait",
    )
    detail = web.http.get(f"/api/runs/{parent}/detail").json()
    assert detail["children"] == [
        {"key": "kid", "run_id": kid, "workflow": "web.waits-for-go", "status": "running", "detached": False}
    ]
    assert web.http.get(f"/api/runs/{kid}").json()["parent_run_id"] == parent
    web.client.signal_workflow_run(kid, "go", 1)
    assert web.client.wait_for_workflow_run(parent, timeout=20).result == {"child": {"payload": 1}}


def test_history_paging_goes_back_through_older_records(site: SiteFactory) -> None:
    web = site()
    run = web.client.run_workflow("web.quick", args={"lines": 150}, timeout=30)
    newest = web.http.get(web.run_url(run.run_id)).text
    assert "line 150" in newest and ">line 10<" not in newest
    before = newest.split('data-before="', 1)[1].split('"', 1)[0]
    older = web.http.get(web.run_url(run.run_id), params={"before_seq": before}).text
    assert ">line 10<" in older and 'data-following="no"' in older

    api = web.http.get(f"/api/runs/{run.run_id}/progress", params={"before_seq": before, "limit": 5}).json()
    assert [record["seq"] for record in api["records"]] == list(range(int(before) - 5, int(before)))
    assert api["has_more_older"] is True


def test_json_api_mirrors_the_client(site: SiteFactory) -> None:
    web = site()
    run = web.client.run_workflow("web.quick", args={"lines": 2}, timeout=20)
    about = web.http.get("/api/").json()
    assert about["namespace"] == "default" and "web.quick" in about["workflows"]

    listed = web.http.get("/api/runs", params={"limit": 5}).json()
    assert listed["runs"][0] == web.client.get_workflow_run(run.run_id).to_dict()
    assert listed["next_cursor"] is None
    assert web.http.get(f"/api/runs/{run.run_id}").json() == run.to_dict()
    detail = web.http.get(f"/api/runs/{run.run_id}/detail").json()
    assert detail == web.client.get_workflow_run_detail(run.run_id).to_dict()
    progress = web.http.get(f"/api/runs/{run.run_id}/progress", params={"after_seq": 0, "limit": 500}).json()
    assert progress == web.client.get_workflow_run_progress(run.run_id, after_seq=0, limit=500).to_dict()


def test_bad_options_are_a_400_with_the_clients_message(site: SiteFactory) -> None:
    web = site(worker=False)
    run_id = web.client.start_workflow("web.quick")
    refused = web.http.get("/api/runs", params={"status": "sleeping"})
    assert refused.status_code == 400 and "status must be one of" in refused.json()["error"]["message"]
    limit = web.http.get(f"/api/runs/{run_id}/progress", params={"limit": 0})
    assert limit.status_code == 400 and limit.json()["error"]["code"] == "invalid"
    page = web.http.get("/ns/default/", params={"cursor": "nonsense"})
    assert page.status_code == 400 and "cursor is not one list_workflow_runs returned" in page.text


def test_unknown_run_is_a_404_page_and_a_404_json_error(site: SiteFactory) -> None:
    web = site(worker=False)
    page = web.http.get(web.run_url(UNKNOWN))
    assert page.status_code == 404
    assert "Not found" in page.text and f"Run not found: {UNKNOWN}" in page.text
    assert web.http.get(web.run_url("not-even-an-id")).status_code == 404
    api = web.http.get(f"/api/runs/{UNKNOWN}")
    assert api.status_code == 404
    assert api.json() == {"error": {"code": "not_found", "message": f"Run not found: {UNKNOWN}"}}
    assert web.http.get(f"/api/runs/{UNKNOWN}/events").status_code == 404
    assert web.http.get("/nowhere").status_code == 404


def test_the_runs_api_and_page_filter_by_what_runs_wait_for(site: SiteFactory) -> None:
    web = site()
    waiting = [web.client.start_workflow("web.approval") for _ in range(2)]
    done = web.client.run_workflow("web.quick", timeout=20)
    for run_id in waiting:
        poll(
            lambda r=run_id: (web.client.get_workflow_run(r).snapshot["waiting_for"] or {}).get("name") == "approval",
            within=RUN_BOUND,
            what="the run to wait for approval",
        )
    api = web.http.get("/api/runs", params={"waiting": "approval"}).json()
    assert [run["run_id"] for run in api["runs"]] == waiting[::-1]
    assert {run["run_id"] for run in web.http.get("/api/runs", params={"waiting": "*"}).json()["runs"]} == set(waiting)
    assert web.http.get("/api/runs", params={"waiting": "nobody"}).json()["runs"] == []
    prefixed = web.http.get("/api/runs", params={"run_id_prefix": done.run_id[:12]}).json()
    assert [run["run_id"] for run in prefixed["runs"]] == [done.run_id]
    # A time without a zone is UTC (what a form's datetime-local sends); one that does not parse is refused.
    later = web.http.get("/api/runs", params={"created_after": "2999-01-01T00:00:00"}).json()
    assert later["runs"] == []
    bad = web.http.get("/api/runs", params={"created_after": "yesterday"})
    assert bad.status_code == 400 and "created_after must be a date and time" in bad.text
    page = web.http.get("/ns/default/", params={"waiting": "approval"})
    assert all(run_id in page.text for run_id in waiting) and done.run_id not in page.text
    assert 'name="waiting" value="approval"' in page.text
