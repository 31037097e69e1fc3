"""``create_app``: the web view of one namespace as an ASGI application.

Routes: ``/`` redirects to ``/ns/<namespace>/`` (the runs, searched, and
selected for bulk actions at ``/ns/<namespace>/bulk``), ``/ns/<namespace>/fleet``
the workers and queues, ``/ns/<namespace>/runs/<id>`` is a run, ``/api/``
the JSON API, ``/static/`` the stylesheet and scripts, ``/metrics`` the
namespace's runs for Prometheus (``docs/telemetry.md``). Errors the client
raises on purpose become pages (or JSON under ``/api/``) with the client's
message and an HTTP status; anything else is a 500 that shows no traceback.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterable
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from celery_durable import DurableError, Engine
from celery_durable.local.exposure import LOOPBACK_NAMES
from celery_durable.web import api, bulk, fleet, forms, pages, schedules, streams, throttles
from celery_durable.web.context import STATIC, WebContext, web
from celery_durable.web.hub import RunHub
from celery_durable.web.problems import Forbidden, Problem, problem
from celery_durable.web.security import BasicAuth, Credential, SecurityHeaders, host_name
from celery_durable.web.session import BrowserSession

log = logging.getLogger(__name__)

BODY_SLACK = 64 * 1024


def create_app(
    engine: Engine,
    *,
    namespace: str | None = None,
    read_only: bool = False,
    auth: Credential | None = None,
    flower_url: str | None = None,
    secret: bytes | None = None,
    allowed_hosts: Iterable[str] | None = None,
) -> Starlette:
    """The web view of ``engine.client(namespace)``'s runs.

    ``auth`` puts HTTP Basic on every route; ``read_only`` hides the actions
    and refuses every POST; ``flower_url`` links runs and agent tasks to
    Flower. ``secret`` signs the CSRF and notice cookies (default: random
    per app, so a restart asks open pages to reload before their next POST).
    ``allowed_hosts`` are the ``Host`` names answered (default the loopback
    names; any port of each): give the names your server is reached by, as
    ``build_server`` does with ``served_hosts``. Binding the server is the
    caller's business: ``build_server`` refuses an exposed address without
    ``auth``.
    """
    hosts = LOOPBACK_NAMES if allowed_hosts is None else [host_name(name) for name in allowed_hosts]
    client = engine.client(namespace)
    context = WebContext(
        client=client,
        read_only=read_only,
        flower_url=_flower(flower_url),
        session=BrowserSession(secret),
        hub=RunHub(client),
        # A payload the engine accepts, even URL-encoded (up to 3 bytes per byte), plus the form around it.
        body_limit=3 * engine.settings.max_payload_bytes + BODY_SLACK,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        context.hub.close()

    # The Host check comes first, before auth and routing: a
    # request under a name this server does not serve (a rebound DNS name)
    # is answered 400 "Invalid host header" and nothing else. No "www."
    # redirect: that would answer a name not served with something else.
    middleware = [
        Middleware(TrustedHostMiddleware, allowed_hosts=hosts, www_redirect=False),
        Middleware(SecurityHeaders),
    ]
    if auth is not None:
        middleware.append(Middleware(BasicAuth, credential=auth))
    app = Starlette(
        routes=[
            *pages.routes,
            *bulk.routes,
            *fleet.routes,
            *schedules.routes,
            *throttles.routes,
            *forms.routes,
            *streams.routes,
            *api.routes,
            Route("/metrics", _metrics),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=middleware,
        exception_handlers={
            HTTPException: _http_error,
            Forbidden: _refused,
            DurableError: _refused,
            ValueError: _refused,
        },
        lifespan=lifespan,
    )
    app.state.web = context
    return app


async def _metrics(request: Request) -> Response:
    """Prometheus's scrape: read from storage, on a thread, as every read of the view is."""
    from prometheus_client import CONTENT_TYPE_LATEST

    from celery_durable.telemetry.exposition import web_metrics

    body = await run_in_threadpool(web_metrics, web(request).client)
    return Response(body, media_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"})


def _flower(url: str | None) -> str | None:
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--flower-url must be an http(s) URL, got {url!r}")
    return url.rstrip("/")


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def _respond(request: Request, found: Problem) -> Response:
    if _wants_json(request):
        return JSONResponse(found.to_dict(), status_code=found.status, headers={"Cache-Control": "no-store"})
    return web(request).render(request, "error.html", {"problem": found}, status_code=found.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {403: "forbidden", 404: "not_found", 405: "method_not_allowed", 413: "too_large", 415: "unsupported"}
    found = Problem(exc.status_code, codes.get(exc.status_code, "http_error"), str(exc.detail))
    response = _respond(request, found)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


async def _refused(request: Request, exc: Exception) -> Response:
    found = problem(exc)
    if found is None:  # not one of ours: a bug, shown as a plain 500 without details
        log.exception("Unexpected error in the web view", exc_info=exc)
        found = Problem(500, "internal", "Internal error: see the server's log")
    return _respond(request, found)
