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


def started(value: str | None) -> bool:
    """Whether the message an entry stands for has started running."""
    return value is not None and value.startswith("x|")
