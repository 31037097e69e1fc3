"""The run page's buttons: cancel, pause, resume, signal, approve.

Every POST passes the same gates in the same order: the server is not
read-only, the body is a small URL-encoded form, and it carries the CSRF
token of the browser's cookie (else 403, and nothing is done). Then one
action runs, and the browser is redirected back to the run page, which
shows what happened or why the run refused. A form whose own input is
wrong (a payload that is not JSON) is shown again with the text as typed,
so nothing is sent and nothing is lost.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from celery_durable.web import actions
from celery_durable.web.bodies import FORM_TYPE, media_type, read_form
from celery_durable.web.context import WebContext
from celery_durable.web.pages import render_run, run_url, served
from celery_durable.web.problems import BadRequest, Forbidden, problem
from celery_durable.web.session import CSRF_FIELD, Notice

TRUE_WORDS = frozenset({"1", "on", "true", "yes"})

Perform = Callable[[], actions.Outcome]


STALE = "The form's CSRF token is missing or stale: reload the page and try again"


async def checked_form(request: Request, context: WebContext) -> dict[str, str]:
    """The form's fields, once it proved to come from one of this server's pages."""
    if media_type(request) != FORM_TYPE:
        raise Forbidden(STALE)  # not one of the pages' forms, so it cannot carry their token
    form = await read_form(request, context.body_limit)
    if not context.session.csrf_valid(request, form.get(CSRF_FIELD)):
        raise Forbidden(STALE)
    return form


def plan(context: WebContext, run_id: str, action: str, form: dict[str, str]) -> Perform:
    """The client call a form asks for; ``BadRequest`` when its fields are wrong."""
    client = context.client
    if action == "cancel":
        return lambda: actions.cancel(client, run_id)
    if action == "pause":
        return lambda: actions.pause(client, run_id)
    if action == "resume":
        force = form.get("force", "").lower() in TRUE_WORDS
        return lambda: actions.resume(client, run_id, force=force)
    if action == "signal":
        name = actions.signal_name(form.get("name"))
        payload = actions.signal_payload(form.get("payload"))
        return lambda: actions.signal(client, run_id, name, payload)
    if action == "approve":
        decision = form.get("decision")
        if decision not in ("approve", "reject"):
            raise BadRequest("Choose approve or reject")
        note = form.get("note", "").strip() or None
        return lambda: actions.approve(client, run_id, approved=decision == "approve", note=note)
    raise HTTPException(404, f"No action {action!r}")


async def act(request: Request) -> Response:
    context = served(request)
    run_id, action = request.path_params["run_id"], request.path_params["action"]
    if context.read_only:
        raise Forbidden("This server is read-only: it shows runs and changes none")
    form = await checked_form(request, context)
    try:
        perform = plan(context, run_id, action, form)
    except BadRequest as exc:
        return await render_run(
            request, context, run_id, status_code=400, notice=Notice("error", str(exc)), form=form
        )
    back = RedirectResponse(run_url(context.namespace, run_id), status_code=303)
    try:
        outcome = await context.call(perform)
    except Exception as exc:
        refusal = problem(exc)
        if refusal is None or refusal.status == 404:  # a bug, or no such run: not a refusal to show
            raise
        code = f" [{refusal.code}]" if refusal.code not in ("invalid", "refused") else ""
        context.session.leave_notice(back, "error", f"Refused{code}: {refusal.message}")
        return back
    context.session.leave_notice(back, "ok", outcome.message)
    return back


routes = [
    Route("/ns/{namespace}/runs/{run_id}/{action}", act, methods=["POST"]),
]
