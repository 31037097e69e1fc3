"""The operator's actions through the page's forms and the JSON API: what
they do to a real run, and what a refusal looks like."""

from __future__ import annotations

import pytest

from tests.web.conftest import Site, SiteFactory, held, needs_signals, waiting
from tests.web.support import new_gate


def follow(web: Site, response: object) -> str:
    """The page a POST redirects to, with its notice."""
    assert response.status_code == 303, response.text  # type: ignore[attr-defined]
    return web.http.get(response.headers["location"]).text  # type: ignore[attr-defined]



def test_cancel_from_the_form_ends_the_run_cancelled(site: SiteFactory) -> None:
    web = site()
    run_id = held(web)
    page = follow(web, web.act(run_id, "cancel"))
    assert "notice-ok" in page
    assert "Cancellation requested" in page or "The run is cancelled." in page
    assert web.client.wait_for_workflow_run(run_id, timeout=20).status == "cancelled"
    after = web.http.get(web.run_url(run_id)).text
    assert "status-cancelled" in after and 'id="actions"' not in after


def test_a_refused_resume_shows_the_clients_reason(site: SiteFactory) -> None:
    web = site()
    run = web.client.run_workflow("web.quick", timeout=20)
    token = web.token(held(web))  # a page with forms, for a token: any run's page gives the same one
    refused = web.act(run.run_id, "resume", token=token, force="1")
    fragment = web.http.get(web.run_url(run.run_id) + "/live")  # what a live page fetches meanwhile
    assert "notice" not in fragment.text  # leaves the notice for the page it was meant for
    page = follow(web, refused)
    assert "notice-error" in page
    assert f"Refused [non_resumable]: Run {run.run_id} is completed and cannot be resumed" in page
    assert web.client.get_workflow_run(run.run_id).attempt == 1


def test_resume_with_force_takes_over_a_live_attempt(site: SiteFactory) -> None:
    web = site()
    run_id = held(web)
    refused = follow(web, web.act(run_id, "resume"))
    assert "Refused [already_active]" in refused and "pass force=True" in refused
    forced = follow(web, web.act(run_id, "resume", force="on"))
    assert "Resumed: attempt 2" in forced
    assert web.client.get_workflow_run(run_id).attempt == 2


def test_malformed_signal_json_is_shown_and_nothing_is_sent(site: SiteFactory) -> None:
    web = site()
    run_id = held(web)
    before = web.client.get_workflow_run_progress(run_id).newest_seq
    response = web.act(run_id, "signal", name="go", payload='{"approved": tru')
    assert response.status_code == 400
    assert "The payload is not valid JSON (Expecting value: line 1 column 14 (char 13)); no signal was sent" in (
        response.text
    )
    if hasattr(web.client, "signal_workflow_run"):  # the form is shown where signals exist
        assert "{&#34;approved&#34;: tru</textarea>" in response.text  # the text as typed, to fix
    assert web.client.get_workflow_run_progress(run_id).newest_seq == before
    assert web.client.get_workflow_run(run_id).status == "running"
    missing = web.act(run_id, "signal", name="  ", payload="{}")
    assert missing.status_code == 400 and "A signal needs a name" in missing.text


def test_the_api_acts_and_refuses_like_the_forms(site: SiteFactory) -> None:
    web = site()
    run_id = held(web, second=new_gate())
    form_encoded = web.api_post(f"/api/runs/{run_id}/pause", data={"x": "1"})
    assert form_encoded.status_code == 415  # what a cross-site form could send, were it to hold a token
    empty = web.api_post(f"/api/runs/{run_id}/pause")
    assert empty.status_code == 415
    bad = web.api_post(f"/api/runs/{run_id}/resume", json={"force": "yes"})
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "force must be true or false"
    unknown = web.api_post(f"/api/runs/{run_id}/resume", json={"force": False, "limits": {"max_steps": 9}})
    assert unknown.status_code == 400 and unknown.json()["error"]["message"] == "resume takes force; not 'limits'"
    extra = web.api_post(f"/api/runs/{run_id}/pause", json={"now": True})
    assert extra.status_code == 400 and extra.json()["error"]["message"] == "pause takes no keys; not 'now'"
    refused = web.api_post(f"/api/runs/{run_id}/resume", json={})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "already_active"
    cancelled = web.api_post(f"/api/runs/{run_id}/cancel", json={})
    assert cancelled.status_code == 200
    assert cancelled.json()["message"].startswith(("Cancellation requested", "The run is cancelled"))
    assert web.client.wait_for_workflow_run(run_id, timeout=20).status == "cancelled"
    again = web.api_post(f"/api/runs/{run_id}/resume", json={"force": True})
    assert again.status_code == 409 and again.json()["error"]["code"] == "non_resumable"
    assert web.api_post(f"/api/runs/{run_id}/explode", json={}).status_code == 404


@needs_signals
def test_a_signal_from_the_form_reaches_the_waiting_run(site: SiteFactory) -> None:
    web = site()
    run_id = waiting(web, "web.waits-for-go")
    page = web.http.get(web.run_url(run_id)).text
    assert "Waiting for the signal go" in page
    sent = follow(web, web.act(run_id, "signal", name="go", payload='{"n": [1, 2]}'))
    assert "Signal &#39;go&#39; sent." in sent
    assert web.client.wait_for_workflow_run(run_id, timeout=20).result == {"payload": {"n": [1, 2]}}


@needs_signals
@pytest.mark.parametrize(("decision", "note", "expected"), [
    ("approve", "looks fine", {"approved": True, "note": "looks fine"}),
    ("reject", "", {"approved": False, "note": None}),
])
def test_approve_and_reject_send_the_approval_signal(
    site: SiteFactory, decision: str, note: str, expected: dict[str, object]
) -> None:
    web = site()
    run_id = waiting(web, "web.approval")
    page = web.http.get(web.run_url(run_id)).text
    assert 'id="approval"' in page and 'value="approve"' in page and 'value="reject"' in page
    follow(web, web.act(run_id, "approve", decision=decision, note=note))
    assert web.client.wait_for_workflow_run(run_id, timeout=20).result == {"payload": expected}


@needs_signals
def test_the_api_signals_and_approves(site: SiteFactory) -> None:
    web = site()
    run_id = waiting(web, "web.approval")
    bad = web.api_post(f"/api/runs/{run_id}/approve", json={"approved": "yes"})
    assert bad.status_code == 400
    sent = web.api_post(f"/api/runs/{run_id}/approve", json={"approved": True, "note": "ok"})
    assert sent.status_code == 200, sent.text
    assert web.client.wait_for_workflow_run(run_id, timeout=20).result == {
        "payload": {"approved": True, "note": "ok"}
    }
    late = web.api_post(f"/api/runs/{run_id}/signal", json={"name": "go", "payload": None})
    assert late.status_code == 400 and "completed" in late.json()["error"]["message"]
