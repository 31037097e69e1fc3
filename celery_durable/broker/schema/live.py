"""The live hash (``P:{R}:live``): the attempt's messages in flight, by task id.

Written by the scripts alone (``token_queued``/``token_running``/``token_done``
and ``liveness`` in ``_prelude.lua``); its values are:

=============================  ================================================
``q|<kind>|<due>``             queued for the coordinator (``c``), steps (``s``)
                               or agents (``a``) queue, due at ``<due>`` ms
``q|<kind>|<due>|held <ms>``   received by a worker at ``<ms>``, not started
``q|<kind>|<due>|gone <ms>``   found gone from its queue at ``<ms>``, not started
``x|<expiry>``                 running, its heartbeat renewing it to ``<expiry>``
``l|<ms>``                     held by a worker found dead at ``<ms>``: lost
=============================  ================================================
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def started(value: str | None) -> bool:
    """Whether the message an entry stands for has started running."""
    return value is not None and value.startswith("x|")


# A worker's held hash (``P:{fleet}:held:W``, task id -> value): the messages
# it said it holds, which die with it. A run's own message (coordinator,
# branch, agent) is ``<run id>``: its entry in the run's live hash is marked
# lost. A call's answer is ``<run id>@<delivery tag>``: it has no live entry
# (its called task may run for hours, out of any rule's reach), so the broker
# message itself is given back (``tasks/redelivery.py``), where the Redis
# transport would keep it unacknowledged for the whole visibility timeout.
ANSWER_MARK = "@"
HELD_TOKEN = re.compile(r"\A[0-9A-Za-z_.:-]{1,128}\Z")
"""What a task id or delivery tag in a held hash may be (Celery's and kombu's
are UUIDs): the claim joins them with '|' and ' ', so a forged message's id
with either in it would make the claim's reply unreadable, and the workers
it claimed would be buried with nothing marked lost."""


@dataclass(frozen=True, slots=True)
class HeldMessage:
    """One value of a worker's held hash."""

    run_id: str
    answer_tag: str | None = None
    """The broker's delivery tag of a call's answer; None for a run's own message."""

    def value(self) -> str:
        return self.run_id if self.answer_tag is None else f"{self.run_id}{ANSWER_MARK}{self.answer_tag}"

    @classmethod
    def parse(cls, value: str) -> HeldMessage:
        run_id, mark, tag = value.partition(ANSWER_MARK)
        return cls(run_id, tag if mark else None)
