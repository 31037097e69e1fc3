"""The two journals the contract tests run against, behind one small interface.

A ``Backend`` is one run, created as the client creates it, and what the
tests need around its journal: the run's journal for an epoch, and direct
writes of the few fields a lifecycle script leaves (a newer epoch after a
resume, a settled status, an agent turn's outcome) — so that the contract
covers exactly the ``Journal`` protocol, not scripts under change elsewhere.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any, Literal

import pytest

from celery_durable import Engine, Settings, define_workflow
from celery_durable.broker import Journal, RunStore
from celery_durable.broker.memory import MemoryJournal
from celery_durable.broker.progress import ProgressSlice
from celery_durable.testing.fleet import new_memory_run

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
        engine = Engine([WORKFLOW], settings)
        self.store: RunStore = engine.store
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


class MemoryBackend(Backend):
    name = "memory"

    def __init__(self, limits: dict[str, Any] | None) -> None:
        self.run_id = uuid.uuid4().hex
        self.run = new_memory_run(WORKFLOW, run_id=self.run_id, limits=limits)
        self.state = self.run.state

    def _hash(self, where: Where) -> dict[str, str]:
        return self.state.run if where == "run" else self.state.journal

    def journal(self, epoch: int) -> Journal:
        return MemoryJournal(self.run, epoch)

    def write(self, where: Where, fields: dict[str, str | None]) -> None:
        with self.run.lock:
            for name, value in fields.items():
                if value is None:
                    self._hash(where).pop(name, None)
                else:
                    self._hash(where)[name] = value

    def field(self, where: Where, name: str) -> str | None:
        with self.run.lock:
            return self._hash(where).get(name)

    def page(self) -> ProgressSlice:
        return self.run.progress_page("", "after", 0, 500)

    def step_rows(self) -> dict[str, str]:
        return self.run.step_rows()

    def agent_rows(self) -> dict[str, str]:
        return self.run.agent_rows()


BackendFactory = Callable[..., Backend]


@pytest.fixture(params=["redis", "memory"])
def make_backend(request: pytest.FixtureRequest) -> Iterator[BackendFactory]:
    """``make_backend(limits=None)``: a new run on the parametrized storage."""
    if request.param == "redis":
        settings: Settings = request.getfixturevalue("settings")
        yield lambda limits=None: RedisBackend(settings, limits)
    else:
        yield lambda limits=None: MemoryBackend(limits)


@pytest.fixture
def both(request: pytest.FixtureRequest) -> Callable[..., tuple[Backend, Backend]]:
    """``both(limits=None)``: the same new run on Redis and in memory, for side-by-side transcripts."""
    settings: Settings = request.getfixturevalue("settings")
    return lambda limits=None: (RedisBackend(settings, limits), MemoryBackend(limits))
