"""The JSON API under ``/api/``: the client's methods over HTTP.

Reads return the client's own JSON forms (``to_dict()``); errors return
``{"error": {"code", "message"}}`` with the client's stable code and an
HTTP status (``problems``). The POSTs take ``application/json`` bodies and
are refused on a read-only server, like the page's forms. Each must also
prove it is no cross-site request: an ``X-CSRF-Token`` header
with the token of ``GET /api/session``, or an ``Origin`` naming this server
(what a browser sends from the server's own pages); else 403, before the
body is read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from celery_durable.client import history
from celery_durable.web import actions, bulk, search
from celery_durable.web.bodies import read_json
from celery_durable.web.context import WebContext, web
from celery_durable.web.problems import BadRequest, Forbidden
from celery_durable.web.search import RunsQuery
from celery_durable.web.security import names_this_server
from celery_durable.web.session import CSRF_HEADER

MAX_RUNS_LIMIT = 500
UNPROVEN = (
    f"This POST carries no valid {CSRF_HEADER} header (its value comes from GET /api/session) "
    "and no Origin header naming this server"
)


def _int_param(request: Request, name: str, *, low: int, high: int | None = None) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{name} must be an integer, got {text[:40]!r}") from None
    if value < low or (high is not None and value > high):
        raise BadRequest(f"{name} must be from {low} to {high}" if high is not None else f"{name} must be >= {low}")
    return value


def _json(data: Any, status_code: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status_code, headers={"Cache-Control": "no-store"})


async def about(request: Request) -> Response:
    context = web(request)
    return _json(
        {"namespace": context.namespace, "read_only": context.read_only, "workflows": context.workflow_names}
    )


async def session(request: Request) -> Response:
    """The CSRF token a script sends back in ``X-CSRF-Token``; the cookie too, for a page's forms."""
    context = web(request)
    response = _json({"csrf_token": context.session.csrf_token(request)})
    context.session.persist(request, response)
    return response


async def list_runs(request: Request) -> Response:
    """The runs page's search, as JSON: the same options (``search``), and ``limit``."""
    context = web(request)
    limit = _int_param(request, "limit", low=1, high=MAX_RUNS_LIMIT) or 50
    page = await context.call(search.list_runs, context.client, RunsQuery.of(request.query_params), limit)
    return _json(
        {
            "namespace": context.namespace,
            "runs": [run.to_dict() for run in page.runs],
            "next_cursor": page.next_cursor,
        }
    )


Handler = Callable[[Request], Awaitable[Response]]


def reader(method: str, param: str) -> Handler:
    """``GET`` of one thing: the client's ``method`` of the path's ``param``, as JSON."""

    async def read(request: Request) -> Response:
        context = web(request)
        found = await context.call(getattr(context.client, method), request.path_params[param])
        return _json(found.to_dict())

    return read


def kind_routes(
    kind: str, param: str, page: Handler, act: Handler, api: tuple[Handler, Handler, Handler]
) -> list[Route]:
    """The routes of a page of one kind (schedules, throttles): the page and
    its forms' actions; ``api``, its JSON list, one by ``param``, and its actions."""
    list_api, get_api, act_api = api
    return [
        Route(f"/ns/{{namespace}}/{kind}", page, methods=["GET"], name=kind),
        Route(f"/ns/{{namespace}}/{kind}/{{{param}}}/{{action}}", act, methods=["POST"]),
        Route(f"/api/{kind}", list_api, methods=["GET"]),
        Route(f"/api/{kind}/{{{param}}}", get_api, methods=["GET"]),
        Route(f"/api/{kind}/{{{param}}}/{{action}}", act_api, methods=["POST"]),
    ]


get_run = reader("get_workflow_run", "run_id")
get_detail = reader("get_workflow_run_detail", "run_id")


async def get_progress(request: Request) -> Response:
    context = web(request)
    page = await context.call(
        context.client.get_workflow_run_progress,
        request.path_params["run_id"],
        phase_id=request.query_params.get("phase_id") or None,
        after_seq=_int_param(request, "after_seq", low=-1),
        before_seq=_int_param(request, "before_seq", low=-1),
        limit=_int_param(request, "limit", low=1),
    )
    return _json(page.to_dict())


async def get_history(request: Request) -> Response:
    """``get_workflow_run_history``: ``after`` and ``limit`` as the client takes them."""
    context = web(request)
    page = await context.call(
        context.client.get_workflow_run_history,
        request.path_params["run_id"],
        after=_int_param(request, "after", low=0),
        limit=_int_param(request, "limit", low=1, high=history.LIMIT_MAX) or history.DEFAULT_LIMIT,
    )
    return _json(page.to_dict())


async def get_value(request: Request) -> Response:
    """The whole value a history event previews, by its ``value_ref`` (``?ref=``)."""
    context = web(request)
    run_id = request.path_params["run_id"]
    ref = request.query_params.get("ref") or ""
    await context.call(context.client.get_workflow_run, run_id)  # unknown, or another namespace's: 404
    try:
        value = await context.call(history.read_value, context.client.engine.store, run_id, ref)
    except LookupError as exc:
        raise HTTPException(404, str(exc)) from None
    return _json({"ref": ref, "value": value})


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false")
    return value


ACTION_KEYS = {
    "cancel": (), "pause": (), "resume": ("force",), "signal": ("name", "payload"), "approve": ("approved", "note"),
}
"""What each action's body may hold (docs/web.md). A key it does not take is
refused, not dropped: a resume sent ``limits`` would otherwise resume under
the old ones and answer 200."""


def _plan(context: WebContext, run_id: str, action: str, body: dict[str, Any]) -> actions.Outcome:
    client = context.client
    taken = ACTION_KEYS.get(action)
    unknown = sorted(set(body) - set(taken or ()))
    if taken is not None and unknown:
        allowed = ", ".join(taken) or "no keys"
        raise BadRequest(f"{action} takes {allowed}; not {', '.join(map(repr, unknown))}")
    if action == "cancel":
        return actions.cancel(client, run_id)
    if action == "pause":
        return actions.pause(client, run_id)
    if action == "resume":
        return actions.resume(client, run_id, force=_flag(body, "force"))
    if action == "signal":
        name = body.get("name")
        if not isinstance(name, str):
            raise BadRequest("name must be a string")
        return actions.signal(client, run_id, actions.signal_name(name), body.get("payload"))
    if action == "approve":
        note = body.get("note")
        if note is not None and not isinstance(note, str):
            raise BadRequest("note must be a string or null")
        if not isinstance(body.get("approved"), bool):
            raise BadRequest("approved must be true or false")
        return actions.approve(client, run_id, approved=body["approved"], note=note)
    raise HTTPException(404, f"No action {action!r}")


def _proven(request: Request, context: WebContext) -> None:
    """The gates every POST passes before its body is read: not read-only, and no cross-site request."""
    if context.read_only:
        raise Forbidden("This server is read-only: it shows runs and changes none")
    if not (context.session.csrf_signed(request.headers.get(CSRF_HEADER)) or names_this_server(request.headers)):
        raise Forbidden(UNPROVEN)


async def proven_body(request: Request) -> tuple[WebContext, dict[str, Any]]:
    """A POST to the API past its gates (``_proven``), and its JSON body."""
    context = web(request)
    _proven(request, context)
    return context, await read_json(request, context.body_limit)


async def act(request: Request) -> Response:
    context, body = await proven_body(request)
    outcome = await context.call(
        _plan, context, request.path_params["run_id"], request.path_params["action"], body
    )
    return _json(outcome.to_dict())


async def act_in_bulk(request: Request) -> Response:
    """``POST /api/bulk/{cancel|resume}`` with ``{"run_ids": [...], "force": false}``: each run's result.

    200 whatever each run answered: the answer says per run (``ok``, ``message``,
    ``code``, ``status``), and ``failed`` counts the runs that refused.
    """
    context = web(request)
    _proven(request, context)
    action = bulk.check_action(request.path_params["action"])
    body = await read_json(request, context.body_limit)
    run_ids = body.get("run_ids")
    if not isinstance(run_ids, list):
        raise BadRequest("run_ids must be a list of run ids")
    checked = bulk.check_run_ids(run_ids)
    force = _flag(body, "force")
    results = await context.call(bulk.perform, context.client, action, checked, force=force)
    return _json(
        {
            "action": action,
            "results": [result.to_dict() for result in results],
            "succeeded": sum(result.ok for result in results),
            "failed": sum(not result.ok for result in results),
        }
    )


routes = [
    Route("/api/", about, methods=["GET"]),
    Route("/api/bulk/{action}", act_in_bulk, methods=["POST"]),
    Route("/api/session", session, methods=["GET"]),
    Route("/api/runs", list_runs, methods=["GET"]),
    Route("/api/runs/{run_id}", get_run, methods=["GET"]),
    Route("/api/runs/{run_id}/detail", get_detail, methods=["GET"]),
    Route("/api/runs/{run_id}/progress", get_progress, methods=["GET"]),
    Route("/api/runs/{run_id}/history", get_history, methods=["GET"]),
    Route("/api/runs/{run_id}/value", get_value, methods=["GET"]),
    Route("/api/runs/{run_id}/{action}", act, methods=["POST"]),
]
