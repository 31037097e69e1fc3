"""The fleet page: who works for this namespace's runs, what waits in the
queues, and which runs were taken over lately (``fleet_status``).

A still picture read when the page loads (Redis and the broker, on a
thread); ``/ns/<ns>/fleet/live`` renders the same part alone, which the
page's script fetches again every few seconds. ``GET /api/fleet`` is the
same as JSON.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from celery_durable.client.fleet_status import FleetStatus, read_fleet
from celery_durable.web.context import web
from celery_durable.web.pages import served

REFRESH_SECONDS = 5


async def fleet_page(request: Request) -> Response:
    context = served(request)
    fleet = await context.call(read_fleet, context.client)
    return context.render(request, "fleet.html", {"fleet": fleet, "refresh_ms": REFRESH_SECONDS * 1000})


async def fleet_fragment(request: Request) -> Response:
    context = served(request)
    fleet = await context.call(read_fleet, context.client)
    return context.render(request, "fleet_live.html", {"fleet": fleet}, fragment=True)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def fleet_dict(fleet: FleetStatus) -> dict[str, Any]:
    data: dict[str, Any] = _plain(dataclasses.asdict(fleet))
    data["alive"] = fleet.alive
    return data


async def fleet_api(request: Request) -> Response:
    context = web(request)
    fleet = await context.call(read_fleet, context.client)
    return JSONResponse(fleet_dict(fleet), headers={"Cache-Control": "no-store"})


routes = [
    Route("/ns/{namespace}/fleet", fleet_page, methods=["GET"], name="fleet"),
    Route("/ns/{namespace}/fleet/live", fleet_fragment, methods=["GET"]),
    Route("/api/fleet", fleet_api, methods=["GET"]),
]
