"""A workflow for a test in one line: ``wf(name, run)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_durable import define_workflow


def wf(name: str, run: Any, phases: tuple[str, ...] = (), **meta: Any) -> Any:
    """``run`` as the workflow ``name`` (described by its name), with ``phases``
    titled in order and any other metadata in ``meta``."""
    return define_workflow({"name": name, "description": name, "phases": [{"title": t} for t in phases], **meta}, run)


def refusal_of(call: Callable[[], Any]) -> str:
    """The message of the ``ValueError`` ``call()`` raised, or "no error"."""
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return "no error"
