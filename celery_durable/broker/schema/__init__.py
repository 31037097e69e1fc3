"""Every stored format, built and parsed here: the one owner of what Redis holds.

The Lua scripts in ``lua/`` read and change the same layout; each names the
fields it touches with the literals below, and ``tests/test_schema.py``
checks that every literal a script uses is one this module documents. Keys
themselves are built in ``keys.py``.

**Run hash** (``P:{R}:run``), one field per line of ``RUN_FIELDS``.

**Journal hash** (``P:{R}:journal``), one run's history:

===================  =========================================================
``n:<seq>``          ops recorded in sequence ``<seq>``
``o:<seq>:<i>``      op ``i`` of ``<seq>``: ``"<epoch>:<identity>"``
``v:<key>``          outcome of the step (or call) ``<key>`` (``Outcome``)
``i:<key>``          inputs of the task call ``<key>``: ``{"args", "kwargs"}`` JSON
``x:<seq>:<i>``      value of op ``i``: now()/uuid4() text, a wait's outcome
``wd:<seq>:<i>``     due time (ms) of wait op ``i``, fixed when first reached
``r:<call>:<j>``     outcome of branch ``j`` of fan-out ``<call>``
``c:<call>``         branches of ``<call>`` still outstanding
``d:<call>``         ``"<epoch>:<execution>"`` that dispatched them
``s:<call>``         epoch whose dispatch finished sending them
``g:<call>:<task>``  ``"<epoch>|<j>,<j>,..."`` branches task ``<task>`` handed on
``h:<seq>``          progress high-water mark (a position, see ``position``)
``k:<seq>``          cut ``"<epoch>:<op index>"``: older attempts' later ops are dead
``a:<id>``           outcome of agent turn ``<id>``
``q:<id>``/``qe:<id>``  agent turn request JSON / the epoch that asked for it
``w:<id>``           owners waiting for the turn, space separated
===================  =========================================================

A *sequence* ``<seq>`` is one ordered stream of calls: ``m`` is the main
body; ``m.3.7`` is branch 7 of the fan-out that was op 3 of ``m``. A *call*
``<seq>:<i>`` names a fan-out op. An *owner* is whom a finished wait wakes:
``m`` (the coordinator) or ``<call>/<j>`` (the branch task of a top-level
branch). Op identities: ``s|<key>`` step, ``p|<n>``/``l|<n>`` parallel /
pipeline of n, ``t|`` now(), ``u|`` uuid4(), ``a|<id>`` agent turn, ``z|``
sleep, ``g|<name>`` signal wait, ``c|<key>`` task call, ``v|<patch id>``
patch marker (``ctx.patched``: it carries no value), ``k|<key>`` child run
waited for, ``d|<key>`` child run started detached (``schema.children``,
which also owns the children hash).

**Step rows** (``P:{R}:steps`` settled, ``P:{R}:running`` running, by key)
and **agent rows** (``P:{R}:agents`` by ``"<agent id>@<epoch>"``) are JSON
objects (``StepRow``/``agent_row``); Lua changes only their ``status``.

**Outcomes** (``v:``, ``r:``, ``a:`` fields): ``o<json>`` a value;
``e<epoch>|<json>`` an ordinary failure and ``f<epoch>|<json>`` a fatal one,
tagged with the attempt that saw them, so failures replay identically within
that attempt and are retried after it (SPEC §4). One-character tags let Lua
tell them apart without decoding JSON.
"""

from celery_durable.broker.schema.children import (
    CHILD_FAILED,
    CHILD_FIELDS,
    CHILD_TIMEOUT,
    SETTLED_FOR_PARENT,
    ChildEntry,
    child_error,
    child_outcome,
    child_run_id,
    child_status,
    outcome_payload,
    parent_fields,
    parse_children,
    slot_error,
)
from celery_durable.broker.schema.journal import (
    JOURNAL_FIELDS,
    MAIN,
    POSITION_STRIDE,
    SIGNAL_FIELDS,
    Identity,
    SequenceHistory,
    branch_field,
    branch_of,
    branch_owner,
    branch_seq,
    branch_seq_of,
    call_id,
    cut_argument,
    describe,
    handoff_field,
    handoff_value,
    op_field,
    parse_handoff,
    parse_sequence,
    position,
    step_field,
    value_field,
)
from celery_durable.broker.schema.outcomes import (
    Outcome,
    decode_outcome,
    failure_outcome,
    value_outcome,
)
from celery_durable.broker.schema.rows import (
    AGENT_STATUSES,
    STEP_STATUSES,
    StepRow,
    agent_row_key,
    finished_agent_row,
    parse_agent_row,
    queued_agent_row,
)
from celery_durable.broker.schema.run import (
    INDEX_META_FIELDS,
    RUN_FIELDS,
    THROTTLE_FIELDS,
    new_run_fields,
    parse_run,
    wait_outcome,
)
from celery_durable.broker.schema.schedules import SCHEDULE_FIELDS, schedule_fields, schedule_run_id

__all__ = [
    "AGENT_STATUSES",
    "CHILD_FAILED",
    "CHILD_FIELDS",
    "CHILD_TIMEOUT",
    "SETTLED_FOR_PARENT",
    "ChildEntry",
    "child_error",
    "child_outcome",
    "child_run_id",
    "child_status",
    "outcome_payload",
    "parent_fields",
    "parse_children",
    "slot_error",
    "JOURNAL_FIELDS",
    "MAIN",
    "POSITION_STRIDE",
    "INDEX_META_FIELDS",
    "RUN_FIELDS",
    "SCHEDULE_FIELDS",
    "schedule_fields",
    "schedule_run_id",
    "SIGNAL_FIELDS",
    "THROTTLE_FIELDS",
    "STEP_STATUSES",
    "Identity",
    "Outcome",
    "SequenceHistory",
    "StepRow",
    "agent_row_key",
    "handoff_field",
    "handoff_value",
    "parse_handoff",
    "branch_field",
    "branch_of",
    "branch_owner",
    "branch_seq",
    "branch_seq_of",
    "call_id",
    "cut_argument",
    "decode_outcome",
    "describe",
    "failure_outcome",
    "finished_agent_row",
    "new_run_fields",
    "op_field",
    "parse_agent_row",
    "parse_run",
    "parse_sequence",
    "position",
    "queued_agent_row",
    "step_field",
    "value_field",
    "value_outcome",
    "wait_outcome",
]
