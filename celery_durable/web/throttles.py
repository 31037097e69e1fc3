"""The throttles page: each throttle's settings, holders, waiters (in the
order they get slots) and top keys, with set (create or change) and delete
under the rules of every action (``forms``, ``api``). ``GET
/api/throttles[/<name>]`` as JSON; ``POST /api/throttles/<name>/set`` (the
client's keywords, a rate as ``[n, period_seconds]``) and ``/delete``.
"""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from celery_durable import ThrottleInfo
from celery_durable.client.client import Client
from celery_durable.throttles import rate_of
from celery_durable.web.api import _json, kind_routes, proven_body, reader
from celery_durable.web.context import web
from celery_durable.web.forms import checked_form
from celery_durable.web.pages import served
from celery_durable.web.problems import BadRequest, Forbidden

LIMITS = ("concurrency", "rate", "per_key_concurrency", "per_key_rate")
"""``set_throttle``'s keywords: the form's fields and the API body's keys."""
READ_ONLY = "This server is read-only: it shows throttles and changes none"


def throttles_url(namespace: str) -> str:
    return f"/ns/{namespace}/throttles"


def _read(client: Client) -> list[ThrottleInfo]:
    return [client.get_throttle(info.name) for info in client.list_throttles()]


def form_limits(form: dict[str, str]) -> dict[str, Any]:
    """The form's limits as ``set_throttle`` takes them (a blank field: not
    set); ``BadRequest`` naming a field that is no number. The client checks
    the values themselves."""
    limits: dict[str, Any] = {}
    for name in LIMITS:
        text = form.get(name, "").strip()
        if not text:
            continue
        try:
            limits[name] = rate_of(text) if name.endswith("rate") else int(text)
        except ValueError:
            shape = "N/SECONDS (e.g. 500/60)" if name.endswith("rate") else "a whole number"
            raise BadRequest(f"{name} takes {shape}, got {text!r}") from None
    return limits


def body_limits(body: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(body) - set(LIMITS))
    if unknown:
        raise BadRequest(f"Unknown option {unknown[0]!r}: set takes {', '.join(LIMITS)}")
    return {name: tuple(v) if isinstance(v, list) else v for name, v in body.items()}


def perform(client: Client, name: str, action: str, limits: dict[str, Any]) -> str:
    """One action on the client; the sentence that says what it did."""
    if action == "set":
        info = client.set_throttle(name, **limits)
        return f"Throttle {info.name} set: it applies at once to what waits."
    if action == "delete":
        client.delete_throttle(name)
        return f"Throttle {name} deleted: whatever waited on it goes on unthrottled."
    raise HTTPException(404, f"No action {action!r}")


async def throttles_page(request: Request) -> Response:
    context = served(request)
    found = await context.call(_read, context.client)
    return context.render(request, "throttles.html", {"throttles": found})


async def act(request: Request) -> Response:
    """``POST /ns/<ns>/throttles/set`` (the name a field) or ``/ns/<ns>/throttles/<name>/{set|delete}``."""
    context = served(request)
    if context.read_only:
        raise Forbidden(READ_ONLY)
    form = await checked_form(request, context)
    action = request.path_params.get("action", "set")
    name = request.path_params.get("name") or form.get("name", "").strip()
    if action not in ("set", "delete"):
        raise HTTPException(404, f"No action {action!r}")
    back = RedirectResponse(throttles_url(context.namespace), status_code=303)
    return await context.acted(
        back, lambda: perform(context.client, name, action, form_limits(form) if action == "set" else {})
    )


async def throttles_api(request: Request) -> Response:
    context = web(request)
    found = await context.call(_read, context.client)
    return _json([info.to_dict() for info in found])


throttle_api = reader("get_throttle", "name")


async def act_api(request: Request) -> Response:
    """``{"message", "throttle"}`` (``throttle`` None once deleted)."""
    context, body = await proven_body(request)
    name, action = request.path_params["name"], request.path_params["action"]
    if action not in ("set", "delete"):
        raise HTTPException(404, f"No action {action!r}")
    limits = body_limits(body) if action == "set" else {}
    message = await context.call(perform, context.client, name, action, limits)
    info = await context.call(context.client.get_throttle, name) if action == "set" else None
    return JSONResponse({"message": message, "throttle": info.to_dict() if info else None})


routes = [
    Route("/ns/{namespace}/throttles/set", act, methods=["POST"]),
    *kind_routes("throttles", "name", throttles_page, act, (throttles_api, throttle_api, act_api)),
]
