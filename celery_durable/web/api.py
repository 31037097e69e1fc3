"""The JSON API under ``/api/``: the client's methods over HTTP (SPEC §13).

Reads return the client's own JSON forms (``to_dict()``); errors return
``{"error": {"code", "message"}}`` with the client's stable code and an
HTTP status (``problems``). The POSTs take ``application/json`` bodies and
are refused on a read-only server, like the page's forms. Each must also
prove it is no cross-site request (SPEC §13): an ``X-CSRF-Token`` header
with the token of ``GET /api/session``, or an ``Origin`` naming this server
(what a browser sends from the server's own pages); else 403, before the
body is read.
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from celery_durable.listing import time_param, waiting_param
from celery_durable.web import actions
from celery_durable.web.bodies import read_json
from celery_durable.web.context import WebContext, web
from celery_durable.web.problems import BadRequest, Forbidden
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
    context = web(request)
    params = request.query_params
    limit = _int_param(request, "limit", low=1, high=MAX_RUNS_LIMIT) or 50
    page = await context.call(
        context.client.list_workflow_runs,
        status=params.get("status") or None,
        workflow=params.get("workflow") or None,
        limit=limit,
        cursor=params.get("cursor") or None,
        waiting=waiting_param(params.get("waiting")),
        run_id_prefix=params.get("run_id_prefix") or None,
        created_after=time_param("created_after", params.get("created_after")),
        created_before=time_param("created_before", params.get("created_before")),
    )
    return _json(
        {
            "namespace": context.namespace,
            "runs": [run.to_dict() for run in page.runs],
            "next_cursor": page.next_cursor,
        }
    )


async def get_run(request: Request) -> Response:
    context = web(request)
    run = await context.call(context.client.get_workflow_run, request.path_params["run_id"])
    return _json(run.to_dict())


async def get_detail(request: Request) -> Response:
    context = web(request)
    detail = await context.call(context.client.get_workflow_run_detail, request.path_params["run_id"])
    return _json(detail.to_dict())


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


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise BadRequest(f"{name} must be true or false")
    return value


def _plan(context: WebContext, run_id: str, action: str, body: dict[str, Any]) -> actions.Outcome:
    client = context.client
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


async def act(request: Request) -> Response:
    context = web(request)
    if context.read_only:
        raise Forbidden("This server is read-only: it shows runs and changes none")
    if not (context.session.csrf_signed(request.headers.get(CSRF_HEADER)) or names_this_server(request.headers)):
        raise Forbidden(UNPROVEN)
    body = await read_json(request, context.body_limit)
    outcome = await context.call(
        _plan, context, request.path_params["run_id"], request.path_params["action"], body
    )
    return _json(outcome.to_dict())


routes = [
    Route("/api/", about, methods=["GET"]),
    Route("/api/session", session, methods=["GET"]),
    Route("/api/runs", list_runs, methods=["GET"]),
    Route("/api/runs/{run_id}", get_run, methods=["GET"]),
    Route("/api/runs/{run_id}/detail", get_detail, methods=["GET"]),
    Route("/api/runs/{run_id}/progress", get_progress, methods=["GET"]),
    Route("/api/runs/{run_id}/{action}", act, methods=["POST"]),
]
