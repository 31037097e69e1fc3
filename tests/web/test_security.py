"""Who may see and change runs: CSRF, read-only, Basic auth, the loopback rule,
one namespace per server, and payloads that hold markup."""

from __future__ import annotations

import base64

import pytest

from celery_durable.web import Credential, ExposureError, check_exposure, is_loopback
from tests.support.poll import RUN_BOUND, poll
from tests.web.conftest import SiteFactory
from tests.web.support import XSS, gate, new_gate

AUTH = Credential("operator", "s3cret pass")


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def held_run(web: object) -> tuple[str, str]:
    held = new_gate()
    args = {"first": held, "second": new_gate()}
    run_id = web.client.start_workflow("web.gated", args=args)  # type: ignore[attr-defined]
    return run_id, held


def test_a_post_without_a_valid_csrf_token_is_refused_and_changes_nothing(site: SiteFactory) -> None:
    web = site()
    run_id, held = held_run(web)
    poll(lambda: web.client.get_workflow_run(run_id).status == "running", within=RUN_BOUND, what="the run to start")
    token = web.token(run_id)

    missing = web.http.post(f"{web.run_url(run_id)}/cancel", data={}, follow_redirects=False)
    forged = web.act(run_id, "cancel", token=token[:-2] + "xx")
    assert missing.status_code == 403 and forged.status_code == 403
    assert "CSRF token is missing or stale" in missing.text
    web.http.cookies.clear()  # the right token, but no cookie to match it
    assert web.act(run_id, "cancel", token=token).status_code == 403
    assert web.client.get_workflow_run(run_id).status == "running"

    accepted = web.act(run_id, "pause")  # a fresh page, a fresh cookie and token
    assert accepted.status_code == 303 and accepted.headers["location"] == web.run_url(run_id)
    gate(held).set()
    assert web.client.wait_for_workflow_run(run_id, timeout=20).status == "paused"


def test_read_only_hides_the_actions_and_refuses_every_post(site: SiteFactory) -> None:
    web = site(read_only=True)
    run_id, held = held_run(web)
    poll(lambda: web.client.get_workflow_run(run_id).status == "running", within=RUN_BOUND, what="the run to start")
    page = web.http.get(web.run_url(run_id))
    assert "read-only" in page.text
    assert "<form method=\"post\"" not in page.text and "Cancel</button>" not in page.text
    csrf = web.http.cookies.get("cd_csrf") or ""
    refused = web.http.post(f"{web.run_url(run_id)}/cancel", data={"csrf_token": csrf}, follow_redirects=False)
    assert refused.status_code == 403 and "read-only" in refused.text
    api = web.http.post(f"/api/runs/{run_id}/cancel", json={})
    assert api.status_code == 403 and api.json()["error"]["code"] == "forbidden"
    assert web.client.get_workflow_run(run_id).status == "running"
    gate(held).set()


def test_basic_auth_guards_every_route_when_configured(site: SiteFactory) -> None:
    web = site(auth=AUTH, worker=False)
    for path in ("/", "/ns/default/", "/api/runs", "/static/web.css", "/api/events"):
        denied = web.http.get(path, follow_redirects=False)
        assert denied.status_code == 401, path
        assert denied.headers["www-authenticate"].startswith('Basic realm="celery-durable"')
    assert web.http.get("/ns/default/", headers=basic("operator", "wrong")).status_code == 401
    assert web.http.get("/ns/default/", headers=basic("other", "s3cret pass")).status_code == 401
    assert web.http.get("/ns/default/", headers={"Authorization": "Basic !!!"}).status_code == 401
    assert web.http.get("/ns/default/", headers=basic("operator", "s3cret pass")).status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_addresses_need_no_credential(host: str) -> None:
    assert is_loopback(host)
    check_exposure(host, None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "10.0.0.1", "example.com", "localhost.evil"])
def test_any_other_address_refuses_to_start_without_a_credential(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(ExposureError, match=r"refusing to serve on .* without a credential: pass --auth"):
        check_exposure(host, None)
    check_exposure(host, AUTH)


def test_credentials_must_name_a_user_and_a_password() -> None:
    assert Credential.parse("a:b:c") == Credential("a", "b:c")
    for bad in ("nopassword", ":x", "x:", ""):
        with pytest.raises(ValueError, match="user:password"):
            Credential.parse(bad)


def test_another_namespaces_run_cannot_be_read_by_id(site: SiteFactory) -> None:
    web = site()
    theirs = web.engine.client("other").run_workflow("web.quick", timeout=20)
    assert web.http.get(web.run_url(theirs.run_id)).status_code == 404
    assert web.http.get(f"/ns/default/runs/{theirs.run_id}/live").status_code == 404
    assert web.http.get(f"/api/runs/{theirs.run_id}").status_code == 404
    assert web.http.get(f"/api/runs/{theirs.run_id}/detail").status_code == 404
    assert web.http.get(f"/api/runs/{theirs.run_id}/progress").status_code == 404
    assert web.http.get(f"/api/runs/{theirs.run_id}/events").status_code == 404
    assert web.api_post(f"/api/runs/{theirs.run_id}/cancel", json={}).status_code == 404
    # Nor by naming the namespace in the path: a server shows one namespace.
    assert web.http.get(f"/ns/other/runs/{theirs.run_id}").status_code == 404
    assert web.http.get("/ns/other/").status_code == 404
    assert theirs.run_id not in web.http.get("/ns/default/").text
    assert theirs.run_id not in web.http.get("/api/runs").text


def test_markup_in_a_log_line_and_a_step_result_is_shown_as_text(site: SiteFactory) -> None:
    web = site()
    run = web.client.run_workflow("web.hostile", timeout=20)
    assert run.result == {"html": XSS}
    page = web.http.get(web.run_url(run.run_id))
    body = page.text.split("</head>", 1)[1]
    assert "<script" not in body and "<img" not in body
    assert "&lt;script&gt;window.__xss=1&lt;/script&gt;" in page.text  # the log line and the result, as text
    assert page.text.count("&lt;script&gt;window.__xss=1") >= 2
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    api = web.http.get(f"/api/runs/{run.run_id}").json()
    assert api["result"] == {"html": XSS}  # JSON keeps the value itself: it is data, not a page
