"""Searching a namespace's runs: the runs page's form and ``GET /api/runs``.

Status and workflow filter together; a run-id prefix, a creation time range
and what a run waits for narrow further. The search itself is the client's
(``list_workflow_runs``, which keeps indexes for each of these): this module
reads the options from a query string, checks them into the types the
client takes, and passes each one only when it is set, so a search by
status alone calls the client exactly as before.

The options are named as the client's keywords, in the page's URL as in
the API's. ``waiting`` is ``*`` for runs that wait for anything, else the
name of what they wait for (a signal's name, a child run's id).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from starlette.datastructures import QueryParams

from celery_durable import Client, RunPage
from celery_durable.client.listing import ANY_WAIT
from celery_durable.web.problems import BadRequest

PREFIX = re.compile(r"[0-9a-f]{1,32}")
MAX_TEXT = 200


@dataclass(frozen=True, slots=True)
class RunsQuery:
    """The runs page's filters as typed (strings, for the form to show again) and its cursor."""

    status: str | None = None
    workflow: str | None = None
    cursor: str | None = None
    run_id_prefix: str | None = None
    created_after: str | None = None
    created_before: str | None = None
    waiting: str | None = None
    schedule: str | None = None

    @classmethod
    def of(cls, params: QueryParams) -> RunsQuery:
        def text(name: str) -> str | None:
            value = (params.get(name) or "").strip()
            if len(value) > MAX_TEXT:
                raise BadRequest(f"{name} is longer than {MAX_TEXT} characters")
            return value or None

        return cls(**{name: text(name) for name in cls.__dataclass_fields__})

    def as_params(self) -> dict[str, str | None]:
        return asdict(self)

    @property
    def filtered(self) -> bool:
        """Whether any filter narrows the listing (the cursor does not)."""
        return any(value for name, value in asdict(self).items() if name != "cursor")

    def client_options(self) -> dict[str, Any]:
        """The keywords of ``list_workflow_runs`` this query sets, checked and typed."""
        options: dict[str, Any] = {"status": self.status, "workflow": self.workflow, "cursor": self.cursor}
        if self.run_id_prefix is not None:
            prefix = self.run_id_prefix.lower()
            if not PREFIX.fullmatch(prefix):
                raise BadRequest(
                    f"run_id_prefix must be the start of a run id: 1 to 32 of 0-9 and a-f, got {self.run_id_prefix!r}"
                )
            options["run_id_prefix"] = prefix
        after = _moment("created_after", self.created_after)
        before = _moment("created_before", self.created_before)
        if after is not None and before is not None and after > before:
            raise BadRequest("created_after is later than created_before: no run can be created in between")
        if after is not None:
            options["created_after"] = after
        if before is not None:
            options["created_before"] = before
        if self.waiting is not None:
            options["waiting"] = True if self.waiting == ANY_WAIT else self.waiting
        if self.schedule is not None:
            options["schedule_id"] = self.schedule
        return options


def _moment(name: str, text: str | None) -> datetime | None:
    """A time as a form's ``datetime-local`` sends it (read as UTC), or ISO 8601 with an offset."""
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest(
            f"{name} must be a date and time, YYYY-MM-DDTHH:MM[:SS] in UTC or ISO 8601 with an offset, got {text!r}"
        ) from None
    # An aware time is kept as given: converted to UTC, year 1 at +14:00 would be year 0,
    # which Python cannot hold (OverflowError); the client takes any aware datetime.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def list_runs(client: Client, query: RunsQuery, limit: int) -> RunPage:
    """One page of the search."""
    return client.list_workflow_runs(limit=limit, **query.client_options())
