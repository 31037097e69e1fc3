"""A wake: the message that continues what a script found woken.

Every script that counts a wake (``broker/ops.WAKING_SCRIPTS``, read from the Lua) names the
owners it woke and the task ids their messages carry; what to send for them
is this one value, and ``Engine.deliver`` is the one place that sends it.
The store ran such a script only once the run had a look scheduled
(``store_core.LOOK_FIRST``), so a process that dies between the script and
``deliver`` leaves a run the sweep finds and repairs. Where a wake runs when
the deciding thread could run it itself (a call's answer, an agent turn) is
``tasks/wake_route.route``'s to say (``in_place.wake_owners``); every other
wake is decided outside a worker's task, and goes to its queue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kombu import Queue  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class Wake:
    """Continue ``owner`` of attempt ``epoch`` ("m", or a top-level branch
    "<call>/<j>") with message ``task_id``; a main body's at ``home`` when
    given, naming the run's ``namespace`` when the sender knows it."""

    run_id: str
    epoch: int
    workflow: str
    owner: str
    task_id: str
    home: Queue | None = None
    namespace: str | None = None


def woken(
    run_id: str, epoch: int, workflow: str, owners: Sequence[str], prefix: str, namespace: str | None = None
) -> list[Wake]:
    """The wakes a script counted: the n-th owner (from 1) by message ``<prefix>-<n>``."""
    return [
        Wake(run_id, epoch, workflow, owner, f"{prefix}-{n}", namespace=namespace)
        for n, owner in enumerate(owners, start=1)
    ]
