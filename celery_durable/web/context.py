"""What every request handler shares: the namespace's client and the server's options.

One ``WebContext`` per app, kept on ``app.state``; handlers reach it with
``web(request)``. The client is the only way to the runs: the web view
reads and acts exactly as a script using ``engine.client(namespace)`` would,
so it can show nothing that script could not see, and in particular no
run of another namespace.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import jinja2
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.templating import Jinja2Templates

from celery_durable import Client, is_terminal_status
from celery_durable.client.history_text import event_summary
from celery_durable.web import present
from celery_durable.web.hub import RunHub
from celery_durable.web.problems import problem
from celery_durable.web.session import CSRF_FIELD, BrowserSession

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
TEMPLATES = HERE / "templates"
P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class WebContext:
    client: Client
    read_only: bool
    flower_url: str | None
    session: BrowserSession
    hub: RunHub
    body_limit: int
    """Largest request body read: a signal payload the engine would accept, URL-encoded, and room for the form."""

    @property
    def namespace(self) -> str:
        return self.client.namespace

    @property
    def can_signal(self) -> bool:
        """Signals are the engine's newest feature: the form shows only where the client has them."""
        return hasattr(self.client, "signal_workflow_run")

    @cached_property
    def workflow_names(self) -> list[str]:
        return sorted(self.client.engine.workflows)

    @cached_property
    def templates(self) -> Jinja2Templates:
        environment = jinja2.Environment(
            loader=jinja2.FileSystemLoader(TEMPLATES),
            autoescape=True,  # every template, whatever its name: payloads are shown as text
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        environment.filters.update(
            when=present.when,
            iso=present.iso,
            span=present.span,
            run_duration=present.run_duration,
            step_duration=present.step_duration,
            seconds=present.seconds_text,
            credits=present.credits,
            usage=present.usage,
            waiting=present.waiting,
            waited_children=present.waited_children,
            pretty_json=present.pretty_json,
            event_summary=event_summary,
        )
        environment.globals.update(
            STATUSES=present.STATUSES,
            SETTLED_FOR_GOOD=present.SETTLED_FOR_GOOD,
            STATUSES_SETTLED=[status for status in present.STATUSES if is_terminal_status(status)],
            CSRF_FIELD=CSRF_FIELD,
            static=self._static_url,
            qs=present.query,
            awaits_approval=present.awaits_approval,
            flower_task_url=lambda task_id: present.flower_task_url(self.flower_url, task_id),
            flower_search_url=lambda run_id: present.flower_search_url(self.flower_url, run_id),
        )
        return Jinja2Templates(env=environment)

    @cached_property
    def _static_versions(self) -> dict[str, str]:
        """A content hash per static file, so a browser never runs last release's script."""
        return {
            path.name: hashlib.sha256(path.read_bytes()).hexdigest()[:12] for path in STATIC.iterdir() if path.is_file()
        }

    def _static_url(self, name: str) -> str:
        return f"/static/{name}?v={self._static_versions.get(name, '0')}"

    def render(
        self,
        request: Request,
        template: str,
        context: dict[str, Any],
        status_code: int = 200,
        *,
        fragment: bool = False,
    ) -> Response:
        """A page, with the namespace, options, CSRF token and pending notice every page shows.

        A ``fragment`` (what a page's script fetches) leaves the notice for
        the page it was meant for.
        """
        full = {
            "namespace": self.namespace,
            "read_only": self.read_only,
            "flower_url": self.flower_url,
            "can_signal": self.can_signal,
            "csrf_token": self.session.csrf_token(request),
            "notice": None if fragment else self.session.notice(request),
            **context,
        }
        response = self.templates.TemplateResponse(request, template, full, status_code=status_code)
        response.headers["Cache-Control"] = "no-store"
        self.session.persist(request, response)
        return response

    async def call(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """A blocking client call, off the event loop: Redis I/O must not stall other pages."""
        return await run_in_threadpool(function, *args, **kwargs)

    async def acted(self, back: RedirectResponse, action: Callable[[], str]) -> RedirectResponse:
        """Carry out a form's action; what it says it did, or why it was refused, is the notice ``back`` shows."""
        try:
            message = await self.call(action)
        except Exception as exc:
            refusal = problem(exc)
            if refusal is None:
                raise
            self.session.leave_notice(back, "error", f"Refused [{refusal.code}]: {refusal.message}")
            return back
        self.session.leave_notice(back, "ok", message)
        return back


def web(request: Request) -> WebContext:
    context: WebContext = request.app.state.web
    return context
