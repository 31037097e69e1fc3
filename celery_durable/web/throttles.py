"""The throttles page (SPEC §5e, §13): each throttle's settings, holders,
waiters (in the order they get slots) and top keys, read when the page
loads; ``GET /api/throttles`` and ``/api/throttles/<name>`` the same as JSON."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from celery_durable.client import Client
from celery_durable.throttles import ThrottleInfo
from celery_durable.web.context import web
from celery_durable.web.pages import served


def _read(client: Client) -> list[ThrottleInfo]:
    return [client.get_throttle(info.name) for info in client.list_throttles()]


async def throttles_page(request: Request) -> Response:
    context = served(request)
    found = await context.call(_read, context.client)
    return context.render(request, "throttles.html", {"throttles": found})


async def throttles_api(request: Request) -> Response:
    context = web(request)
    found = await context.call(_read, context.client)
    return JSONResponse([info.to_dict() for info in found], headers={"Cache-Control": "no-store"})


async def throttle_api(request: Request) -> Response:
    context = web(request)
    name = request.path_params["name"]
    info = await context.call(context.client.get_throttle, name)
    return JSONResponse(info.to_dict(), headers={"Cache-Control": "no-store"})


routes = [
    Route("/ns/{namespace}/throttles", throttles_page, methods=["GET"], name="throttles"),
    Route("/api/throttles", throttles_api, methods=["GET"]),
    Route("/api/throttles/{name}", throttle_api, methods=["GET"]),
]
