"""The storage the contract tests hold to its answers: the Lua scripts, on one Redis
(here) and on a Redis Cluster (``tests/test_cluster.py`` imports these tests).

A ``Backend`` is one run, created as the client creates it (with its first
coordinator message in flight), and what the tests need around its journal:
the run's journal for an epoch; direct writes of the few fields a lifecycle
script leaves (a newer epoch after a resume, a settled status, an agent
turn's outcome), so that the journal tests cover exactly the ``Journal``
protocol; and the two run scripts that end durable waits from outside,
``signal`` and ``examine`` (which fires due timers), with time passing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

import pytest

from celery_durable import Settings, define_workflow
from celery_durable.broker import Flags, Journal, RunRecord, RunStore
from celery_durable.broker.child_types import ChildDone
from celery_durable.broker.progress import ProgressSlice
from celery_durable.broker.replies.control import Signalled
from celery_durable.broker.replies.fleet import Examined
from celery_durable.broker.replies.run import BranchStart, CallDone, PassHere
from celery_durable.broker.replies.shape import Refusal
from celery_durable.broker.schema import Outcome, SequenceHistory
from celery_durable.testing import VirtualClock
from celery_durable.testing.environment import _Engine

WORKFLOW = define_workflow(
    meta={
        "name": "contract",
        "description": "The run the contract tests journal into",
        "phases": [{"title": "Work"}],
    },
    run=lambda ctx: None,
)
PHASE_ID = WORKFLOW.phases[0].phase_id

Where = Literal["run", "journal"]


class Backend:
    """One run on one storage."""

    name: str
    run_id: str

    def journal(self, epoch: int) -> Journal:
        raise NotImplementedError

    def write(self, where: Where, fields: dict[str, str | None]) -> None:
        """Set fields of the run hash or the journal; None deletes one."""
        raise NotImplementedError

    def field(self, where: Where, name: str) -> str | None:
        raise NotImplementedError

    def page(self) -> ProgressSlice:
        raise NotImplementedError

    def step_rows(self) -> dict[str, str]:
        raise NotImplementedError

    def agent_rows(self) -> dict[str, str]:
        raise NotImplementedError

    def record(self) -> RunRecord:
        raise NotImplementedError

    def live(self) -> dict[str, str]:
        """The run's messages in flight (the live hash)."""
        raise NotImplementedError

    def waits(self) -> dict[str, dict[str, Any]]:
        """The registered waits, decoded, by "<seq>:<i>"."""
        raise NotImplementedError

    def events(self) -> list[tuple[str, str]]:
        """The run's history so far, as (kind, key) in order."""
        raise NotImplementedError

    def signal(self, name: str, payload_json: str = "null", prefix: str = "sig") -> Signalled:
        """signal.lua: deliver a signal."""
        raise NotImplementedError

    def examine(self, fire_prefix: str = "") -> Examined:
        """examine.lua; with ``fire_prefix`` the due timers fire."""
        raise NotImplementedError

    def call_done(self, epoch: int, key: str, outcome: str, error: str = "", prefix: str = "done") -> list[str] | None:
        """call_done.lua: a called task's answer."""
        raise NotImplementedError

    def call_done_here(
        self, key: str, outcome: str, token: str, seq: str, start: int, soft: bool = False
    ) -> CallDone | None:
        """call_done.lua for attempt 1, asking to run the main body's pass ``token`` here."""
        raise NotImplementedError

    def pass_time(self, ms: int) -> None:
        """``ms`` pass for the run's waits: every due time that was ``ms`` away is now."""
        raise NotImplementedError

    def tell(self, key: str, child: str, outcome: Outcome, prefix: str = "told") -> ChildDone:
        """child_done.lua as a child's settling runs it: its end told to this run."""
        raise NotImplementedError

    def activate(self, token: str) -> Flags | int:
        """activate.lua for attempt 1's pass whose message is ``token``."""
        raise NotImplementedError

    def activate_reading(self, token: str, seq: str, start: int) -> tuple[Flags, SequenceHistory] | int:
        """activate.lua with the tail of ``seq`` from ``start`` to read."""
        raise NotImplementedError

    def branch_start(
        self, epoch: int, token: str, call: str, indices: list[int], seqs: list[str], workflow: str = "contract"
    ) -> BranchStart | Refusal:
        """branch_start.lua: a branch task's start and first reads, or its refusal."""
        raise NotImplementedError

    def release(self, token: str) -> bool:
        """release.lua for that pass."""
        raise NotImplementedError

    def requeue(self, epoch: int, token: str, new: str) -> bool:
        """requeue.lua: a wake sent home goes to the coordinator queue as ``new``."""
        raise NotImplementedError

    def refused(self) -> int:
        return int(self.field("run", "refused") or 0)

    def progress(self) -> list[tuple[str, str | None, str]]:
        return [(record.kind, record.phase_id, record.message) for record in self.page().records]

    def take_over(self) -> int:
        """What a resume leaves for the journal: the next epoch owns the run."""
        epoch = int(self.field("run", "epoch") or 0) + 1
        self.write("run", {"epoch": str(epoch), "attempt": str(epoch), "limit": ""})
        return epoch

    def settle(self, status: str) -> None:
        self.write("run", {"status": status})


class RedisBackend(Backend):
    """A run on a real redis-server, started by the client (no worker picks it up)."""

    name = "redis"

    def __init__(self, settings: Settings, limits: dict[str, Any] | None) -> None:
        self.clock = VirtualClock()
        engine = _Engine([WORKFLOW], settings, None)
        self.store = RunStore(settings, clock=self.clock.now_ms)
        engine.env_store = self.store
        self.run_id = engine.client().start_workflow(WORKFLOW, limits=limits)
        self.keys = self.store.run_keys(self.run_id)

    def _key(self, where: Where) -> str:
        return self.keys.run if where == "run" else self.keys.journal

    def journal(self, epoch: int) -> Journal:
        return self.store.journal(self.run_id, epoch, "default")

    def write(self, where: Where, fields: dict[str, str | None]) -> None:
        for name, value in fields.items():
            if value is None:
                self.store.client.hdel(self._key(where), name)
            else:
                self.store.client.hset(self._key(where), name, value)

    def field(self, where: Where, name: str) -> str | None:
        value = self.store.client.hget(self._key(where), name)
        return None if value is None else str(value)

    def page(self) -> ProgressSlice:
        return self.store.progress_page(self.run_id, "", "after", 0, 500)

    def step_rows(self) -> dict[str, str]:
        return self.store.step_rows(self.run_id)

    def agent_rows(self) -> dict[str, str]:
        return self.store.agent_rows(self.run_id)

    def record(self) -> RunRecord:
        record = self.store.load_run(self.run_id)
        assert record is not None
        return record

    def live(self) -> dict[str, str]:
        return dict(self.store.client.hgetall(self.keys.live))

    def waits(self) -> dict[str, dict[str, Any]]:
        return {at: json.loads(raw) for at, raw in self.store.client.hgetall(self.keys.waits).items()}

    def events(self) -> list[tuple[str, str]]:
        return [(fields["k"], fields["y"]) for _, fields in self.store.client.xrange(self.keys.history)]

    def signal(self, name: str, payload_json: str = "null", prefix: str = "sig") -> Signalled:
        return self.store.signal(self.run_id, "default", name, payload_json, prefix)

    def examine(self, fire_prefix: str = "") -> Examined:
        examined = self.store.examine(self.run_id, "", fire_prefix=fire_prefix)
        assert examined is not None
        return examined

    def call_done(self, epoch: int, key: str, outcome: str, error: str = "", prefix: str = "done") -> list[str] | None:
        return self.store.call_done(self.run_id, epoch, key, outcome, error, prefix)

    def call_done_here(
        self, key: str, outcome: str, token: str, seq: str, start: int, soft: bool = False
    ) -> CallDone | None:
        here = PassHere(token, "default", "resend", seq, start, soft)
        return self.store.call_done_here(self.run_id, 1, key, outcome, "", token.rsplit("-", 1)[0], here)

    def activate(self, token: str) -> Flags | int:
        return self.store.activate(self.run_id, 1, token, "default", "resend")

    def activate_reading(self, token: str, seq: str, start: int) -> tuple[Flags, SequenceHistory] | int:
        return self.store.activate_reading(self.run_id, 1, token, "default", "resend", seq, start)

    def branch_start(
        self, epoch: int, token: str, call: str, indices: list[int], seqs: list[str], workflow: str = "contract"
    ) -> BranchStart | Refusal:
        return self.store.branch_start(self.run_id, epoch, workflow, token, call, indices, seqs)

    def release(self, token: str) -> bool:
        return self.store.release(self.run_id, token, 1)

    def requeue(self, epoch: int, token: str, new: str) -> bool:
        return self.store.requeue(self.run_id, epoch, token, new).sent

    def pass_time(self, ms: int) -> None:
        """The store's clock moves on: every script is told the later time."""
        self.clock.advance(ms / 1000)

    def tell(self, key: str, child: str, outcome: Outcome, prefix: str = "told") -> ChildDone:
        return self.store.tell_parent(self.run_id, "default", key, child, outcome, prefix)


BackendFactory = Callable[..., Backend]


@pytest.fixture
def make_backend(settings: Settings) -> BackendFactory:
    """``make_backend(limits=None)``: a new run, created as the client creates one."""
    return lambda limits=None: RedisBackend(settings, limits)
