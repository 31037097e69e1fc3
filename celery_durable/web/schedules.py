"""The schedules page: each schedule's settings, next ticks and recent
actions (linked to their runs), with pause, unpause and trigger under the
rules of every action (``forms``, ``api``); ``GET /api/schedules[/<id>]``
as JSON.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from celery_durable import Client
from celery_durable.web.api import _json, kind_routes, proven_body, reader
from celery_durable.web.context import web
from celery_durable.web.forms import checked_form
from celery_durable.web.pages import served
from celery_durable.web.problems import Forbidden

ACTIONS = ("pause", "unpause", "trigger")


def schedules_url(namespace: str) -> str:
    return f"/ns/{namespace}/schedules"


def perform(client: Client, schedule_id: str, action: str) -> str:
    """One action on the client; the sentence that says what it did."""
    if action == "pause":
        client.pause_schedule(schedule_id)
        return f"Schedule {schedule_id} paused: it fires nothing until unpaused."
    if action == "unpause":
        info = client.unpause_schedule(schedule_id)
        nxt = info.next_times[0].isoformat() if info.next_times else "none"
        return f"Schedule {schedule_id} unpaused: next tick {nxt}."
    if action == "trigger":
        run_id = client.trigger_schedule(schedule_id)
        return f"Run {run_id} started." if run_id else "The tick was skipped (overlap): the last run still runs."
    raise HTTPException(404, f"No action {action!r}")


async def schedules_page(request: Request) -> Response:
    context = served(request)
    schedules = await context.call(context.client.list_schedules)
    return context.render(request, "schedules.html", {"schedules": schedules, "actions": ACTIONS})


async def act(request: Request) -> Response:
    context = served(request)
    schedule_id, action = request.path_params["schedule_id"], request.path_params["action"]
    if context.read_only:
        raise Forbidden("This server is read-only: it shows schedules and changes none")
    await checked_form(request, context)
    if action not in ACTIONS:
        raise HTTPException(404, f"No action {action!r}")
    back = RedirectResponse(schedules_url(context.namespace), status_code=303)
    return await context.acted(back, lambda: perform(context.client, schedule_id, action))


async def list_api(request: Request) -> Response:
    context = web(request)
    schedules = await context.call(context.client.list_schedules)
    return _json({"schedules": [info.to_dict() for info in schedules]})


get_api = reader("get_schedule", "schedule_id")


async def act_api(request: Request) -> Response:
    """``POST /api/schedules/<id>/{pause|unpause|trigger}``: ``{"message", "schedule", "run_id"?}``."""
    context, _ = await proven_body(request)
    schedule_id, action = request.path_params["schedule_id"], request.path_params["action"]
    if action not in ACTIONS:
        raise HTTPException(404, f"No action {action!r}")
    client = context.client
    if action == "trigger":
        run_id = await context.call(client.trigger_schedule, schedule_id)
        info = await context.call(client.get_schedule, schedule_id)
        message = f"Run {run_id} started." if run_id else "The tick was skipped (overlap)."
        return JSONResponse({"message": message, "run_id": run_id, "schedule": info.to_dict()})
    message = await context.call(perform, client, schedule_id, action)
    info = await context.call(client.get_schedule, schedule_id)
    return JSONResponse({"message": message, "schedule": info.to_dict()})


routes = kind_routes("schedules", "schedule_id", schedules_page, act, (list_api, get_api, act_api))
