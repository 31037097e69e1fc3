"""Bulk actions: cancel or resume the runs an operator selected, each on its own.

From the runs page the selection goes first to a confirmation page (a GET:
it shows each run's workflow and status and changes nothing), whose form
POSTs it back with the page's CSRF token, like every action's form. The
JSON API takes the same request at ``POST /api/bulk/{action}``. Either way
every run is one client call, as its own run page's button would make it,
and its result is reported apart: a run that refused (already settled,
already running, not found) does not stop the others, and the answer lists
each run's outcome or error.

The calls run a few at a time, each waiting less than a single action does
for its run to settle (``BULK_SETTLE_SECONDS``): a selection of a hundred
runs answers in seconds, and a run not settled by then is reported as
requested, as a single action reports it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from celery_durable import Client, RunEnvelope, RunNotFoundError
from celery_durable.client.client import plausible_run_id
from celery_durable.web import actions
from celery_durable.web.bodies import FORM_TYPE, media_type, read_form_lists
from celery_durable.web.pages import served
from celery_durable.web.problems import BadRequest, Forbidden, problem
from celery_durable.web.session import CSRF_FIELD

log = logging.getLogger(__name__)

ACTIONS = ("cancel", "resume")
MAX_BULK = 200
"""Runs one bulk request may name: four pages of the runs page."""
BULK_THREADS = 8
BULK_SETTLE_SECONDS = 0.5
READ_ONLY = "This server is read-only: it shows runs and changes none"
STALE = "The form's CSRF token is missing or stale: reload the page and try again"


@dataclass(frozen=True, slots=True)
class RunResult:
    """What the action did to one run: its outcome, or the error that refused it."""

    run_id: str
    ok: bool
    message: str
    code: str | None
    run: RunEnvelope | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "ok": self.ok,
            "message": self.message,
            "code": self.code,
            "status": self.run.status if self.run is not None else None,
            "run": self.run.to_dict() if self.run is not None else None,
        }


def check_action(action: str) -> str:
    if action not in ACTIONS:
        raise BadRequest(f"A bulk action is one of {', '.join(ACTIONS)}, got {action[:40]!r}")
    return action


def check_run_ids(values: Sequence[Any]) -> list[str]:
    """The selected runs, each once, in the order given."""
    if not values:
        raise BadRequest("Select at least one run")
    run_ids: list[str] = []
    for value in values:
        if not isinstance(value, str) or not plausible_run_id(value):
            raise BadRequest(f"Not a run id: {str(value)[:40]!r}")
        if value not in run_ids:
            run_ids.append(value)
    if len(run_ids) > MAX_BULK:
        raise BadRequest(f"A bulk action takes at most {MAX_BULK} runs, got {len(run_ids)}")
    return run_ids


def perform(client: Client, action: str, run_ids: Sequence[str], *, force: bool = False) -> list[RunResult]:
    """``action`` on each run, a few at a time; results in the order of ``run_ids``."""

    def one(run_id: str) -> RunResult:
        try:
            if action == "cancel":
                outcome = actions.cancel(client, run_id, settle=BULK_SETTLE_SECONDS)
            else:
                outcome = actions.resume(client, run_id, force=force, settle=BULK_SETTLE_SECONDS)
        except Exception as exc:
            refusal = problem(exc)
            if refusal is None:  # a bug: logged with its traceback, and this run alone fails
                log.exception("bulk %s of run %s failed", action, run_id)
                return RunResult(run_id, False, "Internal error: see the server's log", "internal", None)
            return RunResult(run_id, False, refusal.message, refusal.code, actions.read(client, run_id))
        run = outcome.run
        if action == "cancel" and run is not None and run.is_terminal and run.status != "cancelled":
            # The client answers a settled run with its envelope; in a list, "done" would read as cancelled.
            return RunResult(run_id, False, f"Nothing to cancel: the run had settled {run.status}.", "settled", run)
        return RunResult(run_id, True, outcome.message, None, run)

    with ThreadPoolExecutor(max_workers=min(BULK_THREADS, len(run_ids)) or 1) as pool:
        return list(pool.map(one, run_ids))


@dataclass(frozen=True, slots=True)
class Selected:
    """A run on the confirmation page: its envelope, or None when it cannot be found."""

    run_id: str
    run: RunEnvelope | None


def _read_selection(client: Client, run_ids: Sequence[str]) -> list[Selected]:
    selected = []
    for run_id in run_ids:
        try:
            selected.append(Selected(run_id, client.get_workflow_run(run_id)))
        except RunNotFoundError:
            selected.append(Selected(run_id, None))
    return selected


async def confirm(request: Request) -> Response:
    """``GET /ns/<ns>/bulk?action=…&run_id=…``: what would be done, and the button that does it."""
    context = served(request)
    if context.read_only:
        raise Forbidden(READ_ONLY)
    action = check_action(request.query_params.get("action") or "")
    run_ids = check_run_ids(request.query_params.getlist("run_id"))
    selected = await context.call(_read_selection, context.client, run_ids)
    back = request.query_params.get("back") or ""
    page = {"action": action, "selected": selected, "back": back if back.startswith("?") else ""}
    return context.render(request, "bulk_confirm.html", page)


async def act(request: Request) -> Response:
    """``POST /ns/<ns>/bulk``: the confirmed action, and a page with each run's result."""
    context = served(request)
    if context.read_only:
        raise Forbidden(READ_ONLY)
    if media_type(request) != FORM_TYPE:
        raise Forbidden(STALE)
    form = await read_form_lists(request, context.body_limit, max_fields=MAX_BULK + 8)
    if not context.session.csrf_valid(request, (form.get(CSRF_FIELD) or [""])[0]):
        raise Forbidden(STALE)
    action = check_action((form.get("action") or [""])[0])
    run_ids = check_run_ids(form.get("run_id") or [])
    force = (form.get("force") or [""])[0].lower() in ("1", "on", "true", "yes")
    results = await context.call(perform, context.client, action, run_ids, force=force)
    page = {"action": action, "results": results, "failed": sum(not result.ok for result in results)}
    return context.render(request, "bulk_done.html", page)


routes = [
    Route("/ns/{namespace}/bulk", confirm, methods=["GET"]),
    Route("/ns/{namespace}/bulk", act, methods=["POST"]),
]
