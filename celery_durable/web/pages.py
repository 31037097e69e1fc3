"""The HTML pages: a namespace's runs, and one run.

Each page has a fragment route that renders only its live part with the
same templates; the page's script fetches it again when the run (or any
run) changes, so the server stays the only place where HTML is made from
data. Every blocking read runs in one thread-pool call per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from celery_durable import Client, ProgressPage, RunDetail, RunPage
from celery_durable.listing import waiting_param
from celery_durable.web.context import WebContext, web
from celery_durable.web.problems import BadRequest
from celery_durable.web.session import Notice

RUNS_PER_PAGE = 50
PROGRESS_PER_PAGE = 100


def served(request: Request) -> WebContext:
    """The context, once the path's namespace is the one this server shows (else 404)."""
    context = web(request)
    if request.path_params.get("namespace") != context.namespace:
        raise HTTPException(404, f"This server shows the namespace {context.namespace!r} only")
    return context


def runs_url(namespace: str) -> str:
    return f"/ns/{namespace}/"


def run_url(namespace: str, run_id: str) -> str:
    return f"/ns/{namespace}/runs/{run_id}"


async def index(request: Request) -> Response:
    return RedirectResponse(runs_url(web(request).namespace), status_code=302)


@dataclass(frozen=True, slots=True)
class RunsQuery:
    status: str | None
    workflow: str | None
    cursor: str | None
    waiting: str | None = None
    """'*' any wait, else what runs wait for (listing.waiting_param)."""

    @classmethod
    def of(cls, request: Request) -> RunsQuery:
        params = request.query_params
        return cls(
            params.get("status") or None,
            params.get("workflow") or None,
            params.get("cursor") or None,
            params.get("waiting") or None,
        )

    def as_params(self) -> dict[str, str | None]:
        return {"status": self.status, "workflow": self.workflow, "waiting": self.waiting, "cursor": self.cursor}


def _list(client: Client, query: RunsQuery) -> RunPage:
    return client.list_workflow_runs(
        status=query.status,
        workflow=query.workflow,
        limit=RUNS_PER_PAGE,
        cursor=query.cursor,
        waiting=waiting_param(query.waiting),
    )


async def runs_page(request: Request) -> Response:
    context = served(request)
    query = RunsQuery.of(request)
    page = await context.call(_list, context.client, query)
    return context.render(request, "runs.html", {"page": page, "query": query, "workflows": context.workflow_names})


async def runs_fragment(request: Request) -> Response:
    context = served(request)
    query = RunsQuery.of(request)
    page = await context.call(_list, context.client, query)
    return context.render(request, "runs_live.html", {"page": page, "query": query}, fragment=True)


@dataclass(frozen=True, slots=True)
class RunView:
    detail: RunDetail
    progress: ProgressPage | None


def _read_run(client: Client, run_id: str, *, before_seq: int | None, with_progress: bool) -> RunView:
    detail = client.get_workflow_run_detail(run_id)
    progress = (
        client.get_workflow_run_progress(run_id, before_seq=before_seq, limit=PROGRESS_PER_PAGE)
        if with_progress
        else None
    )
    return RunView(detail, progress)


def _before_seq(request: Request) -> int | None:
    text = request.query_params.get("before_seq")
    if not text:
        return None
    if not text.isdigit():
        raise BadRequest(f"before_seq must be a whole number, got {text[:40]!r}")
    return int(text)


async def run_page(request: Request) -> Response:
    context = served(request)
    return await render_run(request, context, request.path_params["run_id"], before_seq=_before_seq(request))


async def render_run(
    request: Request,
    context: WebContext,
    run_id: str,
    *,
    before_seq: int | None = None,
    status_code: int = 200,
    notice: Notice | None = None,
    form: dict[str, str] | None = None,
) -> Response:
    """The run page; a form that failed validation passes its ``notice`` and the values typed."""
    view = await context.call(_read_run, context.client, run_id, before_seq=before_seq, with_progress=True)
    page: dict[str, Any] = {
        "detail": view.detail,
        "run": view.detail.run,
        "progress": view.progress,
        # A page of history is a still picture; the newest page follows the run live.
        "following": before_seq is None,
        "form": form or {},
    }
    if notice is not None:
        page["notice"] = notice
    return context.render(request, "run.html", page, status_code=status_code)


async def run_fragment(request: Request) -> Response:
    context = served(request)
    run_id = request.path_params["run_id"]
    view = await context.call(_read_run, context.client, run_id, before_seq=None, with_progress=False)
    return context.render(request, "run_live.html", {"detail": view.detail, "run": view.detail.run}, fragment=True)


routes = [
    Route("/", index, methods=["GET"]),
    Route("/ns/{namespace}/", runs_page, methods=["GET"], name="runs"),
    Route("/ns/{namespace}/rows", runs_fragment, methods=["GET"]),
    Route("/ns/{namespace}/runs/{run_id}", run_page, methods=["GET"], name="run"),
    Route("/ns/{namespace}/runs/{run_id}/live", run_fragment, methods=["GET"]),
]
