"""Task messages arriving at a worker: what each must hold, and where one
goes that this worker cannot serve.

A message is data from the broker, not a command to trust: a malformed,
forged or stale one is logged and dropped, never executed, and nothing in
it is ever imported or unpickled.

A field this version does not know is ignored, not refused: during a
rolling upgrade a worker takes the messages of the next version too, and a
message it refused would be acknowledged and lost (a call's answer lost so
leaves a call with no timeout waiting for ever). What a later version adds
must therefore be something an older one may ignore; what a message needs
is checked, whatever else it holds.

A well-formed message for a workflow this worker does not know goes back to
its queue (``pass_on``). Several engines may share one broker and one Redis
with their default queues: one team's ``billflow:engine`` beside another's
``myflow:engine``, or workers of yesterday's deploy beside today's. A worker
that takes a message of a run whose workflow its engine does not register
must neither run it (nothing is ever imported by name from a message) nor
fail the run for it: the run is healthy, only this worker cannot serve it.
As Temporal does with a workflow task that no worker of its type took, the
message is sent again under a new id that the run counts in flight in the
same script (``requeue.lua``), until a worker that knows the workflow takes
it: half a second later the first time, then twice as long each time, up to
about 30 s (SPEC §3: never a busy loop). The run counts its passes
(``unserved_passes`` in its hash, zeroed when a pass of it runs), so the
backoff holds whichever worker takes the message next. The run stays alive
meanwhile; the first time a ``system`` progress record and one WARNING line
say which workflow no worker here knows.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from celery_durable.broker.keys import RUN_ID_PATTERN
from celery_durable.names import NAMESPACE_PATTERN, WORKFLOW_NAME_PATTERN
from celery_durable.tasks.app import new_task_id

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

CALL_PATTERN = re.compile(r"m(\.\d{1,9}\.\d{1,9}){0,32}:\d{1,9}")


class BadMessage(ValueError):
    """A task message that is not one celery-durable sends."""


@dataclass(frozen=True, slots=True)
class RunMessage:
    run_id: str
    epoch: int
    workflow: str
    namespace: str | None = None
    """The run's namespace, which a coordinator message names when its
    sender knew it (``coordinator_message``): the pass then reads its run in
    the script that takes its lock. A claim like the rest of the message,
    checked there."""


def parse_run_message(
    run_id: Any, epoch: Any, workflow: Any, extra: dict[str, Any], namespace: Any = None
) -> RunMessage:
    """The run a message names; ``extra``, the fields its task does not
    know, is ignored (module docstring)."""
    if extra:
        logger.debug("ignored fields this version does not know: %.200r", sorted(map(str, extra)))
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.match(run_id):
        raise BadMessage(f"run_id is not a run id: {run_id!r:.80}")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise BadMessage(f"epoch is not a positive integer: {epoch!r:.80}")
    if not isinstance(workflow, str) or not WORKFLOW_NAME_PATTERN.fullmatch(workflow):
        raise BadMessage(f"workflow is not a workflow name: {workflow!r:.80}")
    if namespace is not None and (not isinstance(namespace, str) or not NAMESPACE_PATTERN.match(namespace)):
        raise BadMessage(f"namespace is not a namespace name: {namespace!r:.80}")
    return RunMessage(run_id, epoch, workflow, namespace)


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


# -- a message this worker cannot serve ----------------------------------------

PASS_ON_FIRST_SECONDS = 0.5
"""How long a message passed on the first time waits before a worker takes it
again: short enough that a worker that can serve the run finds it soon."""
PASS_ON_JITTER = (0.8, 1.2)
"""The factor each wait is multiplied by, at random, so that messages passed
on together do not come back together."""

_random = random.Random()

KINDS = {"c": "coordinator", "s": "branch", "a": "agent"}


def knows(engine: Engine, message: RunMessage) -> bool:
    return message.workflow in engine.workflows


def pass_on(engine: Engine, message: RunMessage, token: str, kind: str, resend: Callable[[str, float], None]) -> None:
    """Send ``message`` (task id ``token``, queue kind ``kind``: c, s or a) back
    for a worker that knows its workflow: ``resend(new task id, countdown)``."""
    store = engine.store
    # The backoff doubles per pass up to settings.unserved_backoff_seconds: never a busy loop.
    cap_ms = int(engine.settings.unserved_backoff_seconds * 1000)
    backoff = (int(PASS_ON_FIRST_SECONDS * 1000), cap_ms, _random.uniform(*PASS_ON_JITTER))
    new = new_task_id()
    note = f"No worker that took its messages has workflow {message.workflow!r} registered; they wait for one that has"
    passed = store.requeue(message.run_id, message.epoch, token, new, kind=kind, note=note, backoff=backoff)
    if not passed.sent:
        # Not a queued message of the run's attempt: an older attempt's, or forged.
        engine.count_refused()
        logger.warning(
            "refused stale or forged %s message for run %s (workflow %r, which this worker does not know)",
            KINDS[kind],
            message.run_id,
            message.workflow,
        )
        return
    if passed.first:
        logger.warning(
            "run %s: workflow %r is not registered with this worker's engine; its message goes back to the queue "
            "for a worker that has it",
            message.run_id,
            message.workflow,
        )
    else:
        logger.debug(
            "run %s: passed a message for workflow %r on again, due in %d ms",
            message.run_id,
            message.workflow,
            passed.delay_ms,
        )
    resend(new, passed.delay_ms / 1000)
