"""Fixtures of the web view's tests: an app on a real engine, worker and Redis.

``site(**options)`` builds ``create_app`` on the test's engine (one engine
and in-process worker per test, from tests/conftest.py's ``durable``) and
returns a Starlette ``TestClient`` around it; ``browser`` is a real headless
Chromium from the system packages, driven by Playwright.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from celery_durable import Client, Engine
from celery_durable.web import create_app
from tests.support.poll import RUN_BOUND, poll
from tests.web.support import WORKFLOWS, csrf_token, new_gate, open_all_gates, serving

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@dataclass
class Site:
    engine: Engine
    client: Client
    http: TestClient

    @property
    def ns(self) -> str:
        return self.client.namespace

    def run_url(self, run_id: str) -> str:
        return f"/ns/{self.ns}/runs/{run_id}"

    def token(self, run_id: str) -> str:
        """The CSRF token of the run page's forms (the cookie is kept by the TestClient)."""
        page = self.http.get(self.run_url(run_id))
        assert page.status_code == 200, page.text
        return csrf_token(page.text)

    def act(self, run_id: str, action: str, *, token: str | None = None, **fields: str) -> Any:
        data = {"csrf_token": token if token is not None else self.token(run_id), **fields}
        return self.http.post(f"{self.run_url(run_id)}/{action}", data=data, follow_redirects=False)

    def api_token(self) -> str:
        answer = self.http.get("/api/session")
        assert answer.status_code == 200, answer.text
        return str(answer.json()["csrf_token"])

    def api_post(self, path: str, **options: Any) -> Any:
        """A JSON API POST as a script sends it: the token of ``GET /api/session`` in ``X-CSRF-Token``."""
        headers = {"X-CSRF-Token": self.api_token(), **options.pop("headers", {})}
        return self.http.post(path, headers=headers, **options)


SiteFactory = Callable[..., Site]


@pytest.fixture(autouse=True)
def _release_held_steps() -> Iterator[None]:
    yield
    open_all_gates()


@pytest.fixture
def site(durable: Any) -> Iterator[SiteFactory]:
    """``site(namespace=None, read_only=False, auth=None, flower_url=None, worker=True)``."""
    with contextlib.ExitStack() as stack:
        engines: dict[bool, Any] = {}

        def make(*, worker: bool = True, **options: Any) -> Site:
            if worker not in engines:
                engines[worker] = durable(WORKFLOWS, worker=worker)
            engine = engines[worker].engine
            app = create_app(engine, **options)
            http = stack.enter_context(TestClient(app, base_url="http://127.0.0.1"))
            return Site(engine, engine.client(options.get("namespace")), http)

        yield make


@pytest.fixture
def live(site: SiteFactory) -> Iterator[tuple[Site, str]]:
    """A site, and the URL of its web view served on a loopback port (for a browser)."""
    web = site()
    with serving(create_app(web.engine)) as url:
        yield web, url


def held(web: Site, **extra: str) -> str:
    """A run of ``web.gated`` whose first step is running, held at its gate."""
    run_id = web.client.start_workflow("web.gated", args={"first": new_gate(), **extra})
    poll(
        lambda: web.client.get_workflow_run(run_id).snapshot["steps_running"],
        within=RUN_BOUND,
        what="the held step",
    )
    return run_id


def waiting(web: Site, workflow: str) -> str:
    """A run of ``workflow`` started and waiting (for a signal, a child, a timer)."""
    run_id = web.client.start_workflow(workflow)
    poll(
        lambda: web.client.get_workflow_run(run_id).snapshot.get("waiting_for"),
        within=RUN_BOUND,
        what=f"{workflow} to wait",
    )
    return run_id


needs_signals = pytest.mark.skipif(
    not hasattr(Client, "signal_workflow_run"), reason="Client.signal_workflow_run not built yet"
)


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """Playwright's Chromium launcher, to start Debian's package (never one Playwright would download).

    A module's, not the session's: while Playwright's sync API is open it
    marks its own event loop running in the main thread, and every asyncio
    test that process ran later (``asyncio.run``, anyio) failed."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (.ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is part of the dev extra")
    with sync_api.sync_playwright() as playwright:
        yield playwright.chromium


@pytest.fixture(scope="module")
def browser(chromium: Any) -> Iterator[Any]:
    """Headless Chromium, shared by the tests of a module."""
    launched = chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    try:
        yield launched
    finally:
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context (no cookies shared between tests) and its page."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        tab = context.new_page()
        tab.set_default_timeout(15_000)
        yield tab
    finally:
        context.close()
