"""The in-memory storage: a ``Journal`` with exactly the Redis semantics, no Redis.

Replay unit tests (``tests/unit``) and ``celery_durable.testing`` run on it;
``tests/contract`` holds it to the same typed results as ``RedisJournal`` on
a real server. It is split along the Lua it ports:

- ``memory_prelude``: ``lua/_prelude.lua`` (fence, record_op, commit_call,
  begin_call, cut_sequence, forget_fanout...), over ``RunState``, the run's
  keys as dicts with the field names of ``schema.py``;
- ``memory_liveness``: the prelude's liveness section (the live hash of
  messages in flight, the active-time clock, ``liveness``) and its durable
  waits section (``refresh_waiting``, ``take_signal``, ``wake_waits``);
- ``memory_journal``: ``MemoryJournal``, one method per journal script;
- ``memory_run``: ``MemoryRun``, the run and its lifecycle scripts (create_run,
  activate, release, heartbeat, branch_start/task_end, finish, resume, cancel,
  pause, halt, examine, signal, mark_lost, agent_start/agent_finish,
  read_progress), with the signatures of the ``RunStore`` methods that run
  them (less the run id and namespace).

Adding a script to ``RedisJournal`` or ``RunStore``: port it as a method of
the same name (its docstring naming the ``.lua`` file), port any new prelude
function under its Lua name into ``memory_prelude`` or ``memory_liveness``,
and add its calls to ``tests/contract``, which runs them on both. A script
that sends a message takes its task id and counts it in flight
(``token_queued``) exactly where the Lua does: the active-time clock, and so
``timeout_seconds``, depend on it.
"""

from celery_durable.broker.memory_journal import MemoryJournal
from celery_durable.broker.memory_prelude import RunState
from celery_durable.broker.memory_run import Clock, MemoryRun

__all__ = ["Clock", "MemoryJournal", "MemoryRun", "RunState"]
