"""A message delivered again after its first delivery started: its holder died.

RabbitMQ gives a dead worker's unacknowledged messages back at once (Redis
after its visibility timeout). Run again as if new, the message would go on
in the dead attempt's name: no new epoch, no ``system`` record that the run
recovered, and with ``auto_recover`` off a step run again instead of the run
halted. So a durable task whose message comes back redelivered, and whose
own entry in the run's live hash says it started (``x|``: only the script
that starts a task writes that), is a recovery like the sweep's
(``recovery.take_over``, forced: the broker says the holder died, no lease
need run out); the message itself runs nothing, its attempt is over. Should
that holder still be alive after all (a broken connection, not a death),
the new epoch fences it out of every write.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery_durable.errors import StorageError
from celery_durable.tasks.messages import BadMessage, parse_run_message

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)


def recovered_on_redelivery(engine: Engine, task_id: str, kwargs: dict[str, Any]) -> bool:
    """True when the message was a dead holder's, and its run was recovered
    (or halted) instead: the caller runs nothing."""
    from celery_durable.tasks.recovery import take_over

    try:
        message = parse_run_message(kwargs.get("run_id"), kwargs.get("epoch"), kwargs.get("workflow"), {})
    except BadMessage:
        return False  # the task body refuses it, and says why
    store = engine.store
    try:
        if not task_id or not store.started(message.run_id, task_id):
            return False
        record = store.load_run(message.run_id)
        if record is None or record.epoch != message.epoch or record.status not in ("pending", "running"):
            return False
        cause = f"its worker died running task {task_id}, which the broker delivered again"
        take_over(engine, record, cause, forced=True)
    except StorageError as exc:
        logger.warning("run %s: a message delivered again could not be judged: %s", message.run_id, exc)
        return False
    return True
