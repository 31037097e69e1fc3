"""The in-memory storage: a ``Journal`` with exactly the Redis semantics, no Redis.

Replay unit tests (``tests/unit``) and ``celery_durable.testing`` run on it;
``tests/contract`` holds it to the same typed results as ``RedisJournal`` on
a real server. It is split along the Lua it ports:

- ``memory_prelude``: ``lua/_prelude.lua`` (fence, record_op, commit_call,
  begin_call, cut_sequence, forget_fanout...), over ``RunState``, the run's
  keys as dicts with the field names of ``schema.py``;
- ``memory_journal``: ``MemoryJournal``, one method per journal script;
- ``memory_run``: ``MemoryRun``, the run and its lifecycle scripts (activate,
  finish, resume, cancel, pause, halt, heartbeat, agent_start/agent_finish,
  read_progress).

Adding a script to ``RedisJournal``: port it as a ``MemoryJournal`` method
(its docstring naming the ``.lua`` file), port any new prelude function into
``memory_prelude`` under its Lua name, and add its calls to
``tests/contract/test_journal.py``, which runs them on both.
"""

from celery_durable.broker.memory_journal import MemoryJournal
from celery_durable.broker.memory_prelude import RunState
from celery_durable.broker.memory_run import Clock, MemoryRun

__all__ = ["Clock", "MemoryJournal", "MemoryRun", "RunState"]
