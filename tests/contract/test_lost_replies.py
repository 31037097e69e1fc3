"""A script run again with the same arguments because its reply was lost on the
way (the caller's ``retry_storage`` runs it again on a broken connection)
answers what its first run did and counts nothing twice (issue 25 item 7).

Each script that wakes owners takes a wake prefix that is new for each call:
the owners it woke are kept under it (``woken_before`` in ``_prelude.lua``).
"""

from __future__ import annotations

from celery_durable.broker import schema
from celery_durable.broker.journal import AgentCall, Flags
from tests.contract.conftest import BackendFactory
from tests.support.contract import AGENT, ask, call, ok

ONE_CREDIT = 1_000_000_000
NO_FLAGS = Flags()


def test_an_agent_turns_end_run_twice_counts_its_usage_once_and_wakes_the_same_owners(
    make_backend: BackendFactory,
) -> None:
    backend = make_backend(limits={"max_ai_credits": 1.5})
    store, run_id = backend.store, backend.run_id
    assert ask(backend.journal(1), "m", 0, message="turn") == AgentCall("dispatch", NO_FLAGS)
    assert store.agent_start(run_id, 1, AGENT, "turn", "later", 100).verdict == "go"
    row = schema.finished_agent_row(None, failed=False, started_at=1, completed_at=2, active_ms=1, usage={}, error=None)
    finish = (run_id, 1, AGENT, ok("fine"), row, (ONE_CREDIT, 10, 20), "turn", "woken")
    assert store.agent_finish(*finish).owners == ["m"]
    assert store.agent_finish(*finish).owners == ["m"], "the same owners: the first reply never reached the caller"
    record = backend.record()
    assert (record.credits_nano, record.agents_done, record.agents_running) == (ONE_CREDIT, 1, 0)
    assert record.limit_reached is None, "1 credit used against a 1.5 ceiling, counted once"
    assert backend.field("run", "prompt_tokens") == "10"
    assert backend.live()["woken-1"].startswith("q|c|")


def test_a_calls_answer_journaled_twice_wakes_the_same_owners_and_counts_one_step(make_backend: BackendFactory) -> None:
    backend = make_backend()
    assert call(backend.journal(1), "render").verdict == "publish"
    assert backend.call_done(1, "render", ok({"png": 1}), prefix="answer") == ["m"]
    assert backend.call_done(1, "render", ok({"png": 1}), prefix="answer") == ["m"]
    assert backend.record().steps_done == 1
    assert backend.live()["answer-1"].startswith("q|c|")
    assert backend.call_done(1, "render", ok({"png": 2}), prefix="another") is None, "another answer is late"


def test_an_agent_call_run_twice_dispatches_its_turn_both_times(make_backend: BackendFactory) -> None:
    backend = make_backend()
    journal = backend.journal(1)
    dispatched = AgentCall("dispatch", NO_FLAGS)
    assert ask(journal, "m", 0, message="turn") == dispatched
    assert ask(journal, "m", 0, message="turn") == dispatched, "the caller must still send the turn's message"
    assert backend.field("run", "subagents_used") == "1"
    assert ask(journal, "m.1.0", 0, owner="m:1/0", message="other") == AgentCall("pending", NO_FLAGS)
