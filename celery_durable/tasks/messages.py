"""Validation of task messages arriving at a worker.

A message is data from the broker, not a command to trust: a malformed,
forged or stale one is logged and dropped, never executed, and nothing in
it is ever imported or unpickled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from celery_durable.broker.keys import RUN_ID_PATTERN

CALL_PATTERN = re.compile(r"^m(\.\d{1,9}\.\d{1,9}){0,32}:\d{1,9}$")


class BadMessage(ValueError):
    """A task message that is not one celery-durable sends."""


@dataclass(frozen=True, slots=True)
class RunMessage:
    run_id: str
    epoch: int
    workflow: str


def parse_run_message(run_id: Any, epoch: Any, workflow: Any, extra: dict[str, Any]) -> RunMessage:
    if extra:
        raise BadMessage(f"unexpected fields {sorted(extra)}")
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
        raise BadMessage(f"run_id is not a run id: {run_id!r}")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise BadMessage(f"epoch is not a positive integer: {epoch!r}")
    if not isinstance(workflow, str) or not workflow:
        raise BadMessage(f"workflow is not a name: {workflow!r}")
    return RunMessage(run_id, epoch, workflow)


def parse_branch(call: Any, branch: Any) -> tuple[str, int]:
    if not isinstance(call, str) or not CALL_PATTERN.match(call):
        raise BadMessage(f"call is not a fan-out call id: {call!r}")
    if isinstance(branch, bool) or not isinstance(branch, int) or branch < 0:
        raise BadMessage(f"branch is not a non-negative integer: {branch!r}")
    return call, branch
