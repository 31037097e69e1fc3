"""Validation of task messages arriving at a worker.

A message is data from the broker, not a command to trust: a malformed,
forged or stale one is logged and dropped, never executed, and nothing in
it is ever imported or unpickled.

A field this version does not know is ignored, not refused: during a
rolling upgrade a worker takes the messages of the next version too, and a
message it refused would be acknowledged and lost (a call's answer lost so
leaves a call with no timeout waiting for ever). What a later version adds
must therefore be something an older one may ignore; what a message needs
is checked, whatever else it holds.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from celery_durable.broker.keys import RUN_ID_PATTERN
from celery_durable.names import WORKFLOW_NAME_PATTERN

WORKFLOW_NAME = WORKFLOW_NAME_PATTERN
"""The names define_workflow accepts: a message naming anything else is forged."""
logger = logging.getLogger(__name__)

CALL_PATTERN = re.compile(r"m(\.\d{1,9}\.\d{1,9}){0,32}:\d{1,9}")


class BadMessage(ValueError):
    """A task message that is not one celery-durable sends."""


@dataclass(frozen=True, slots=True)
class RunMessage:
    run_id: str
    epoch: int
    workflow: str


def parse_run_message(run_id: Any, epoch: Any, workflow: Any, extra: dict[str, Any]) -> RunMessage:
    """The run a message names; ``extra``, the fields its task does not
    know, is ignored (module docstring)."""
    if extra:
        logger.debug("ignored fields this version does not know: %.200r", sorted(map(str, extra)))
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
        raise BadMessage(f"run_id is not a run id: {run_id!r:.80}")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise BadMessage(f"epoch is not a positive integer: {epoch!r:.80}")
    if not isinstance(workflow, str) or not WORKFLOW_NAME.fullmatch(workflow):
        raise BadMessage(f"workflow is not a workflow name: {workflow!r:.80}")
    return RunMessage(run_id, epoch, workflow)


MAX_BRANCHES_PER_MESSAGE = 1_000_000


def parse_branches(call: Any, branches: Any) -> tuple[str, tuple[int, ...]]:
    if not isinstance(call, str) or not CALL_PATTERN.fullmatch(call):
        raise BadMessage(f"call is not a fan-out call id: {call!r:.80}")
    if not isinstance(branches, list) or not branches or len(branches) > MAX_BRANCHES_PER_MESSAGE:
        raise BadMessage(f"branches is not a non-empty list of branch indices: {branches!r:.80}")
    for index in branches:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise BadMessage(f"branches holds a value that is not a branch index: {index!r:.80}")
    if len(set(branches)) != len(branches):
        raise BadMessage("branches holds the same index twice")
    return call, tuple(branches)
