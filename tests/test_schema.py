"""The stored formats have one owner: ``broker/schema.py``.

The Lua scripts change the same layout as the Python side. These tests hold
them to it: every field a script names in a hash command is one the schema
documents, and every row and outcome the schema builds parses back.
"""

from __future__ import annotations

import re
from importlib import resources

import pytest

from celery_durable.broker import schema
from celery_durable.broker.schema.run import STATUSES
from celery_durable.errors import StepFailed, StorageCorruptError, WorkflowCancelled, WorkflowLimitReached

LUA = resources.files("celery_durable.broker") / "lua"
HASH_COMMAND = re.compile(r"redis\.call\('H[A-Z]+'")
LITERAL = re.compile(r"'([a-z_]+:?)'")
VALUES = {
    *STATUSES,
    *schema.STEP_STATUSES,
    *schema.AGENT_STATUSES,
    schema.MAIN,
    "",
    ":",
    "settled",  # a fence refusal
    "stale",
    "alive",  # liveness verdicts
    "waiting",
    "dead",
    "null",  # a signal's payload when it has none
    "o",  # an outcome's tag
    "late",  # an answer after its op was stepped over
}
"""Literals a hash command may carry that are values, not field names."""


def hash_literals() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for script in LUA.iterdir():
        for line in script.read_text(encoding="utf-8").splitlines():
            if HASH_COMMAND.search(line):
                for literal in LITERAL.findall(line):
                    if not literal.startswith("H"):
                        found.setdefault(literal, set()).add(script.name)
    return found


def test_every_field_a_script_names_is_documented_by_the_schema() -> None:
    documented = (
        set(schema.RUN_FIELDS)
        | set(schema.JOURNAL_FIELDS)
        | set(schema.SIGNAL_FIELDS)
        | set(schema.INDEX_META_FIELDS)
        | set(schema.SCHEDULE_FIELDS)
        | set(schema.THROTTLE_FIELDS)
        | VALUES
    )
    unknown = {literal: sorted(scripts) for literal, scripts in hash_literals().items() if literal not in documented}
    assert not unknown, f"fields used in Lua but not documented in broker/schema.py: {unknown}"


def test_no_script_slices_a_row_by_position() -> None:
    """Rows are JSON: a script that cuts a row at a fixed offset breaks when a status is renamed."""
    for script in LUA.iterdir():
        text = script.read_text(encoding="utf-8")
        assert "string.sub(rows[" not in text, script.name


@pytest.mark.parametrize(
    "outcome",
    [
        schema.value_outcome({"a": [1, 2.5, None, "é"]}),
        schema.failure_outcome(3, ValueError("boom")),
        schema.failure_outcome(3, StepFailed("k", "TypeError", "not JSON: k", found_by_engine=True)),
        schema.failure_outcome(4, WorkflowCancelled("gone"), fatal=True),
        schema.failure_outcome(5, WorkflowLimitReached("max_total_subagents"), fatal=True),
    ],
)
def test_outcomes_round_trip(outcome: schema.Outcome) -> None:
    assert schema.decode_outcome(outcome.encode()) == outcome


def test_a_fatal_outcome_rebuilds_its_error_by_code() -> None:
    limit = schema.failure_outcome(5, WorkflowLimitReached("max_ai_credits"), fatal=True)
    error = schema.decode_outcome(limit.encode()).fatal_error()
    assert isinstance(error, WorkflowLimitReached) and error.limit == "max_ai_credits"


def test_a_failure_found_by_the_engine_replays_with_its_exact_message() -> None:
    raw = schema.failure_outcome(
        2, StepFailed("k", "TypeError", "Step result must be a JSON value: k", found_by_engine=True)
    ).encode()
    with pytest.raises(StepFailed) as info:
        schema.decode_outcome(raw).step_result("k")
    assert str(info.value) == "Step result must be a JSON value: k"
    assert info.value.error_type == "TypeError"


@pytest.mark.parametrize("raw", ["", "x", "o{", "e|{}", "eX|{}", 'e1|{"type": 1}', "e1|[]"])
def test_anything_else_is_corruption(raw: str) -> None:
    with pytest.raises(StorageCorruptError):
        schema.decode_outcome(raw)


def test_step_rows_round_trip_and_settle() -> None:
    running = schema.StepRow.running(attempt=2, now=1000)
    assert schema.StepRow.parse("k", running.encode()) == running
    failed = running.settled(schema.failure_outcome(7, KeyError("id")), now=1500)
    assert (failed.status, failed.attempt, failed.started_at, failed.finished_at) == ("failed", 2, 1000, 1500)
    assert failed.error == "KeyError: 'id'"


@pytest.mark.parametrize("raw", ["garbage", "completed|1|0|", '{"status": "done", "attempt": 1}', "[]"])
def test_a_step_row_that_celery_durable_did_not_write_is_corruption(raw: str) -> None:
    with pytest.raises(StorageCorruptError, match="row of step 'k'"):
        schema.StepRow.parse("k", raw)


def test_agent_rows_are_built_and_parsed_by_the_schema() -> None:
    queued = schema.queued_agent_row("a" * 32, "reviewer", None, 1, 10)
    finished = schema.finished_agent_row(
        queued, failed=False, started_at=20, completed_at=30, active_ms=10,
        usage={"prompt_tokens": 3, "completion_tokens": 4, "ai_credits": 0.5}, error=None,
    )
    row = schema.parse_agent_row(finished)
    assert (row["label"], row["status"], row["started_at"], row["completed_at"]) == ("reviewer", "completed", 20, 30)
    with pytest.raises(StorageCorruptError, match="agent row"):
        schema.parse_agent_row('{"status": "sleeping"}')


def test_a_run_record_that_does_not_parse_names_the_run() -> None:
    with pytest.raises(StorageCorruptError, match="r-1"):
        schema.parse_run("r-1", {"status": "running", "epoch": "x"})
