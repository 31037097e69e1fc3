"""A message delivered again after its first delivery started: its holder died.

Two halves: a run's own message that comes back (below), and a call's
answer that a dead worker held, which is given back (``give_back``).

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
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from celery_durable.errors import StorageError
from celery_durable.tasks.messages import BadMessage, parse_run_message

if TYPE_CHECKING:
    from celery_durable.engine import Engine

logger = logging.getLogger(__name__)

REDIS_DRIVER = "redis"


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


def give_back(engine: Engine, tags: Sequence[str]) -> int:
    """Put the calls' answers a dead worker held back in their queue, to be taken next.

    An answer is the one message of a call that no run counts in flight: its
    called task may run for hours, so no rule can judge it lost, and a run
    taken over for it would run the called task again. RabbitMQ gives a
    dead consumer's messages back at once. kombu's Redis transport keeps
    them in its ``unacked`` hash until the visibility timeout (hours, above
    the longest step) has passed, and a run would wait as long. So the sweep
    that buries the worker gives them back, by the delivery tags the worker
    said it held, with the transport's own restore (the one its warm
    shutdown uses for what it delivered; an answer acknowledged meanwhile is
    no longer there, and nothing is restored). An answer journaled before
    its holder died and given back again changes nothing: the first write
    of an outcome wins. Returns how many tags were looked up.
    """
    if not tags:
        return 0
    with engine.celery.connection_for_write() as connection:
        if connection.transport.driver_type != REDIS_DRIVER:
            return 0
        qos = connection.default_channel.qos
        for tag in tags:
            # The end consumers pop from (kombu publishes with LPUSH, consumes with BRPOP), as its own restore does.
            qos.restore_by_tag(tag, leftmost=False)
    return len(tags)
