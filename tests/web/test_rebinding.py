"""What another site can do to the web view (SPEC §13, issue 25 item 11):
nothing. It answers only the ``Host`` names it serves, so a page whose DNS
name was rebound to this machine gets 400; and a JSON API POST must carry
the token of ``GET /api/session`` or an ``Origin`` naming this server, so a
cross-site request gets 403 and changes nothing.

"Changes nothing" is checked on the stored run: the forged requests are
approvals of a run that waits for one, and after them the run still waits,
its progress has not moved, and the one real approval sent last is the
payload it finishes with (a signal that had slipped through would be the
one it took).
"""

from __future__ import annotations

import base64
import http.client
import json
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from celery_durable import Settings
from celery_durable.web import Credential, create_app
from tests.support.fleet import ROOT, settings_env
from tests.support.poll import RUN_BOUND, poll
from tests.web.conftest import CHROMIUM, CHROMIUM_ARGS, Site, SiteFactory, needs_signals, waiting
from tests.web.support import serving
from tests.web.test_cli import APP, free_port, one_error_line, web_command

AUTH = Credential("operator", "s3cret pass")
REBOUND = "rebound.test"
"""A name Chromium is told resolves to 127.0.0.1: what a rebinding attacker's DNS answers."""
FORGED = {"approved": True, "note": "forged"}
REAL = {"approved": False, "note": "the operator's"}

pytestmark = needs_signals


def basic() -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{AUTH.user}:{AUTH.password}".encode()).decode()}


def waiting_run(web: Site) -> tuple[str, int]:
    """A run waiting for the signal ``approval``, and its newest progress seq."""
    run_id = waiting(web, "web.approval")
    return run_id, web.client.get_workflow_run_progress(run_id).newest_seq


def assert_unchanged(web: Site, run_id: str, seq: int) -> None:
    run = web.client.get_workflow_run(run_id)
    assert run.status == "running" and run.snapshot.get("waiting_for"), run.to_dict()
    assert web.client.get_workflow_run_progress(run_id).newest_seq == seq


def finishes_with_the_real_approval(web: Site, run_id: str, send: Callable[[Any], tuple[int, str]]) -> None:
    """``send`` the real approval (it must be accepted); the run must finish with it, not a forged one."""
    status, text = send(REAL)
    assert status == 200, text
    assert web.client.wait_for_workflow_run(run_id, timeout=20).result == {"payload": REAL}


def answer(response: Any) -> tuple[int, str]:
    return int(response.status_code), str(response.text)


def request(base: str, method: str, path: str, headers: dict[str, str], body: Any = None) -> tuple[int, str]:
    """One request over a real socket, with exactly the ``Host`` and ``Origin`` given."""
    where = urlsplit(base)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=10)
    try:
        data = None if body is None else json.dumps(body).encode()
        sent = {**headers, **({"Content-Type": "application/json"} if data is not None else {})}
        connection.request(method, path, body=data, headers=sent)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


# -- the Host allow-list --------------------------------------------------------------


def test_a_foreign_host_gets_400_before_auth_and_routing_and_changes_nothing(site: SiteFactory) -> None:
    web = site(auth=AUTH)
    run_id, seq = waiting_run(web)
    web.http.headers.update(basic())
    for path in ("/", "/api/runs", f"/api/runs/{run_id}", "/static/web.css", "/no/such/route"):
        refused = web.http.get(path, headers={"Host": "evil.example"})
        assert refused.status_code == 400, path
        assert refused.headers["content-type"].startswith("text/plain") and refused.text == "Invalid host header"
        assert "www-authenticate" not in refused.headers, "the Host is checked before the credential"
    # Without the credential too: still 400, not 401, so the check came first.
    assert web.http.get("/", headers={"Host": "evil.example", "Authorization": ""}).status_code == 400

    token = web.api_token()  # under a name it serves: valid, but not under another
    forged = web.http.post(
        f"/api/runs/{run_id}/approve",
        json=FORGED,
        headers={"Host": f"{REBOUND}:8080", "Origin": f"http://{REBOUND}:8080", "X-CSRF-Token": token},
    )
    assert forged.status_code == 400
    assert_unchanged(web, run_id, seq)
    finishes_with_the_real_approval(
        web, run_id, lambda body: answer(web.api_post(f"/api/runs/{run_id}/approve", json=body))
    )


SERVED = ["localhost", "localhost:8080", "127.0.0.1", "127.0.0.1:1", "[::1]", "[::1]:8080", "LocalHost:8080"]
NOT_SERVED = ["evil.example", "localhost.evil.example", "127.0.0.2", "[::2]", "0.0.0.0", "", "[::1",
              "localhost:8080@evil.example"]


def test_only_the_loopback_names_are_served_with_or_without_a_port(site: SiteFactory) -> None:
    web = site(worker=False)
    assert {host: web.http.get("/api/", headers={"Host": host}).status_code for host in SERVED + NOT_SERVED} == {
        **{host: 200 for host in SERVED},
        **{host: 400 for host in NOT_SERVED},
    }


def test_the_names_served_follow_the_bound_address_and_the_allowed_hosts() -> None:
    from celery_durable.web import served_hosts

    assert served_hosts("127.0.0.1") == ["127.0.0.1", "localhost", "[::1]"]
    assert served_hosts("::1") == ["[::1]", "localhost", "127.0.0.1"]
    assert served_hosts("127.0.0.5", ["ops.example.com"]) == [
        "127.0.0.5", "localhost", "127.0.0.1", "[::1]", "ops.example.com",
    ]
    # Bound elsewhere: that name and the allowed ones, not the loopback names.
    assert served_hosts("10.0.0.5") == ["10.0.0.5"]
    assert served_hosts("Ops.Example.com", ["ops", "2001:DB8::1", "[2001:db8::2]"]) == [
        "ops.example.com", "ops", "[2001:db8::1]", "[2001:db8::2]",
    ]
    # Every interface is "else" too (SPEC §13): the loopback names only when allowed, as any other.
    assert served_hosts("0.0.0.0", ["ops.example.com"]) == ["0.0.0.0", "ops.example.com"]
    assert served_hosts("::", ["localhost"]) == ["[::]", "localhost"]
    for bad in ("*", "*.example.com", "ops.example.com:8080", "[::1]:8080", "ops/x", "a b", ""):
        with pytest.raises(ValueError, match="must be a host name or an address, without a port or"):
            served_hosts("127.0.0.1", [bad])


def test_allowed_host_admits_a_name_and_refuses_the_others(settings: Settings) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "celery_durable", "web", "--app", APP, "--port", str(port),
         "--allowed-host", "ops.example.test", "--allowed-host", "dash.example.test"],
        env=settings_env(settings), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    base = f"http://127.0.0.1:{port}"

    def status(host: str) -> int:
        try:
            return request(base, "GET", "/api/", {"Host": host})[0]
        except OSError:
            return 0

    try:
        poll(
            lambda: status(f"127.0.0.1:{port}") or process.poll() is not None,
            within=RUN_BOUND,
            what="the server to answer",
        )
        assert status(f"127.0.0.1:{port}") == 200, process.stdout.read() if process.stdout else ""
        assert status(f"ops.example.test:{port}") == 200
        assert status("DASH.example.test") == 200
        assert status(f"localhost:{port}") == 200
        assert status(f"evil.example.test:{port}") == 400
        assert status(f"example.test:{port}") == 400
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=20)


@pytest.mark.parametrize("name", ["ops.example.test:8080", "*"])
def test_a_malformed_allowed_host_is_refused_on_one_line(settings: Settings, name: str) -> None:
    line = one_error_line(web_command(settings, "--allowed-host", name), 2)
    assert line == (
        f"error: --allowed-host must be a host name or an address, without a port or '*': got {name!r}"
    )


# -- CSRF on the JSON API -------------------------------------------------------------


def test_an_api_post_without_token_or_origin_is_refused_403_and_changes_nothing(site: SiteFactory) -> None:
    web = site()
    run_id, seq = waiting_run(web)
    path = f"/api/runs/{run_id}/approve"
    for headers in (
        {},  # neither
        {"X-CSRF-Token": "made-up.c2lnbmVkIGJ5IG5vIG9uZQ"},  # a token this server never signed
        {"X-CSRF-Token": ""},
        {"Origin": "http://evil.example"},  # another site's page
        {"Origin": "http://127.0.0.1:1"},  # another port is another origin
        {"Origin": "null"},  # a sandboxed frame or a file: page
    ):
        refused = web.http.post(path, json=FORGED, headers=headers)
        assert refused.status_code == 403, (headers, refused.text)
        assert refused.json()["error"] == {
            "code": "forbidden",
            "message": "This POST carries no valid X-CSRF-Token header (its value comes from GET /api/session) "
            "and no Origin header naming this server",
        }
    for action in ("cancel", "pause", "resume", "signal"):
        assert web.http.post(f"/api/runs/{run_id}/{action}", json={"name": "approval"}).status_code == 403
    token = web.api_token()
    forged = web.http.post(path, json=FORGED, headers={"X-CSRF-Token": token[:-2] + "xx"})
    assert forged.status_code == 403
    assert_unchanged(web, run_id, seq)

    # A script keeps no cookies: the token of /api/session is enough in the header.
    web.http.cookies.clear()
    session = web.http.get("/api/session")
    assert session.status_code == 200 and session.headers["cache-control"] == "no-store"
    fresh = session.json()["csrf_token"]
    web.http.cookies.clear()
    finishes_with_the_real_approval(
        web, run_id, lambda body: answer(web.http.post(path, json=body, headers={"X-CSRF-Token": fresh}))
    )


def test_a_notice_cookie_does_not_pass_for_a_token(site: SiteFactory) -> None:
    web = site()
    run_id, _ = waiting_run(web)
    sent = web.act(run_id, "signal", name="other", payload="")  # leaves a signed notice cookie
    assert sent.status_code == 303
    notice = web.http.cookies.get("cd_notice")
    assert notice
    refused = web.http.post(f"/api/runs/{run_id}/approve", json=FORGED, headers={"X-CSRF-Token": notice})
    assert refused.status_code == 403
    assert web.client.get_workflow_run(run_id).snapshot.get("waiting_for")


@pytest.fixture
def server(site: SiteFactory) -> Iterator[tuple[Site, str]]:
    web = site()
    with serving(create_app(web.engine)) as url:
        yield web, url


def test_an_origin_naming_the_server_itself_is_enough(server: tuple[Site, str]) -> None:
    web, base = server
    run_id, seq = waiting_run(web)
    path = f"/api/runs/{run_id}/approve"
    own = urlsplit(base).netloc
    cross_site = request(base, "POST", path, {"Host": own, "Origin": "http://evil.example"}, FORGED)
    assert cross_site[0] == 403, cross_site
    other_port = request(base, "POST", path, {"Host": own, "Origin": "http://127.0.0.1:1"}, FORGED)
    assert other_port[0] == 403, other_port
    # The Origin must name the Host the request came under, not just any name this server serves.
    other_name = request(base, "POST", path, {"Host": own, "Origin": f"http://localhost:{urlsplit(base).port}"}, FORGED)
    assert other_name[0] == 403, other_name
    assert_unchanged(web, run_id, seq)

    finishes_with_the_real_approval(
        web, run_id, lambda body: request(base, "POST", path, {"Host": own, "Origin": base}, body)
    )


# -- in a browser: the attack itself ------------------------------------------------------


@pytest.fixture
def rebinding_page(chromium: Any) -> Iterator[Any]:
    """A Chromium to which ``rebound.test`` resolves to 127.0.0.1, as after a DNS rebinding."""
    launched = chromium.launch(
        executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1"]
    )
    try:
        context = launched.new_context()
        tab = context.new_page()
        tab.set_default_timeout(15_000)
        yield tab
    finally:
        launched.close()


def test_a_page_under_a_rebound_name_can_neither_read_nor_act(server: tuple[Site, str], rebinding_page: Any) -> None:
    web, base = server
    run_id, seq = waiting_run(web)
    port = urlsplit(base).port
    loaded = rebinding_page.goto(f"http://{REBOUND}:{port}/ns/default/runs/{run_id}")
    assert loaded is not None and loaded.status == 400
    assert rebinding_page.content().count(run_id) == 0, "the run page was not served"
    # The attacker's script, running in the rebound origin: same-origin to the browser, so it
    # could read answers and send JSON with any header. The server refuses the name itself.
    answers = rebinding_page.evaluate(
        """async ([runId, body]) => {
            const read = await fetch(`/api/runs/${runId}`);
            const session = await fetch("/api/session");
            const acted = await fetch(`/api/runs/${runId}/approve`, {
                method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
            return [read.status, session.status, acted.status, await read.text()];
        }""",
        [run_id, FORGED],
    )
    assert answers[:3] == [400, 400, 400] and run_id not in answers[3]
    assert_unchanged(web, run_id, seq)
    # The server's own name still works, in the same browser.
    own = rebinding_page.goto(f"{base}/ns/default/runs/{run_id}")
    assert own is not None and own.status == 200
