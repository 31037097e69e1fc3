"""The HTML pages: a namespace's runs (searched as ``search`` reads the form), and one run.

Each page has a fragment route that renders only its live part with the
same templates; the page's script fetches it again when the run (or any
run) changes, so the server stays the only place where HTML is made from
data. Every blocking read runs in one thread-pool call per request.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from markupsafe import Markup
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from celery_durable import Client, ProgressPage, RunDetail, RunPage
from celery_durable.client import history
from celery_durable.client.history import HistoryEvent, HistoryTail
from celery_durable.client.listing import ANY_WAIT
from celery_durable.web import search
from celery_durable.web.context import WebContext, web
from celery_durable.web.problems import whole_number
from celery_durable.web.search import RunsQuery
from celery_durable.web.session import Notice
from celery_durable.web.timeline import timeline_svg

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


def _list(client: Client, query: RunsQuery) -> RunPage:
    return search.list_runs(client, query, RUNS_PER_PAGE)


async def runs_page(request: Request) -> Response:
    context = served(request)
    query = RunsQuery.of(request.query_params)
    page = await context.call(_list, context.client, query)
    return context.render(
        request, "runs.html", {"page": page, "query": query, "workflows": context.workflow_names, "any_wait": ANY_WAIT}
    )


async def runs_fragment(request: Request) -> Response:
    context = served(request)
    query = RunsQuery.of(request.query_params)
    page = await context.call(_list, context.client, query)
    return context.render(request, "runs_live.html", {"page": page, "query": query}, fragment=True)


@dataclass(frozen=True, slots=True)
class RunView:
    detail: RunDetail
    progress: ProgressPage | None
    story: HistoryTail
    timeline: Markup
    inputs: dict[str, str]
    """A preview of each call's inputs, by key (``history.call_inputs``)."""
    waiting_since: datetime | None
    """When the wait ``snapshot.waiting_for`` names began (``_waiting_since``)."""

    def live(self) -> dict[str, Any]:
        """What ``run_live.html`` shows, on the page and in each live fragment."""
        return {
            "detail": self.detail,
            "run": self.detail.run,
            "story": self.story,
            "timeline": self.timeline,
            "inputs": self.inputs,
            "waiting_since": self.waiting_since,
        }


HISTORY_ON_PAGE = 50
"""The newest events the run page shows (older ones: the history page)."""


def _read_run(client: Client, run_id: str, *, before_seq: int | None, with_progress: bool) -> RunView:
    detail = client.get_workflow_run_detail(run_id)
    progress = (
        client.get_workflow_run_progress(run_id, before_seq=before_seq, limit=PROGRESS_PER_PAGE)
        if with_progress
        else None
    )
    store = client.engine.store
    story = history.newest(store, detail.run.run_id, HISTORY_ON_PAGE)
    every = history.newest(store, detail.run.run_id, TIMELINE_EVENTS, previews=False).events
    inputs = history.call_inputs(store, detail.run.run_id, [step.key for step in detail.steps if step.task is not None])
    since = _waiting_since(detail.run.snapshot.get("waiting_for"), every)
    return RunView(detail, progress, story, timeline_svg(detail, every), inputs, since)


def _waiting_since(waiting_for: dict[str, Any] | None, events: list[HistoryEvent]) -> datetime | None:
    """When the run began the wait its snapshot names (SPEC §13: what it waits
    for and since when): the newest ``wait_started`` of that kind and name,
    else of that kind (one of several children); None past the events read."""
    if not waiting_for:
        return None
    started = [e for e in events if e.kind == "wait_started" and e.data.get("kind") == waiting_for.get("kind")]
    named = [e for e in started if e.data.get("name") == waiting_for.get("name")] or started
    return max(named, key=lambda event: event.seq).at if named else None


TIMELINE_EVENTS = 2000
"""Events the timeline reads its waits and fan-outs from (the newest)."""


def _query_number(request: Request, name: str) -> int | None:
    text = request.query_params.get(name)
    return whole_number(name, text) if text else None


async def run_page(request: Request) -> Response:
    context = served(request)
    before_seq = _query_number(request, "before_seq")
    return await render_run(request, context, request.path_params["run_id"], before_seq=before_seq)


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
        **view.live(),
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
    return context.render(request, "run_live.html", view.live(), fragment=True)


async def history_page(request: Request) -> Response:
    """The whole history, a page at a time (the run page shows the newest events)."""
    context = served(request)
    run_id = request.path_params["run_id"]
    page = await context.call(context.client.get_workflow_run_history, run_id, after=_query_number(request, "after"))
    run = await context.call(context.client.get_workflow_run, run_id)
    return context.render(request, "history.html", {"run": run, "events": page.events, "next": page.next})


routes = [
    Route("/", index, methods=["GET"]),
    Route("/ns/{namespace}/", runs_page, methods=["GET"], name="runs"),
    Route("/ns/{namespace}/rows", runs_fragment, methods=["GET"]),
    Route("/ns/{namespace}/runs/{run_id}", run_page, methods=["GET"], name="run"),
    Route("/ns/{namespace}/runs/{run_id}/live", run_fragment, methods=["GET"]),
    Route("/ns/{namespace}/runs/{run_id}/history", history_page, methods=["GET"]),
]
