"""A message for a workflow this worker does not know goes back to its queue.

Several engines may share one broker and one Redis with their default
queues: one team's ``billflow:engine`` beside another's ``myflow:engine``, or
workers of yesterday's deploy beside today's. A worker that takes a message
of a run whose workflow its engine does not register must neither run it
(nothing is ever imported by name from a message) nor fail the run for it:
the run is healthy, only this worker cannot serve it. As Temporal does with
a workflow task that no worker of its type took, the message is sent again
under a new id that the run counts in flight in the same script
(``requeue.lua``), until a worker that knows the workflow takes it: half a
second later the first time, then twice as long each time, up to about 30 s
(SPEC §3: never a busy loop). The run counts its passes (``unserved_passes``
in its hash, zeroed when a pass of it runs), so the backoff holds whichever
worker takes the message next. The run stays alive meanwhile; the first time
a ``system`` progress record and one WARNING line say which workflow no
worker here knows.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from celery_durable.tasks.app import new_task_id
from celery_durable.tasks.messages import RunMessage

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

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
