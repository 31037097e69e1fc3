"""``max_payload_bytes`` bounds everything a run stores (SPEC §10): args, step
results, branch results, agent outputs, run results and log lines above it
are refused with an error that names the limit, and nothing that large is
ever written to Redis.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable import FunctionRunner, WorkflowContext, workflow

TIMEOUT = 30
LIMIT = 2048
BIG = "é" * LIMIT  # 2 bytes a character in UTF-8: the limit counts bytes


@workflow(name="sizes", description="makes one thing of the size it is asked for", phases=[])
def sizes(ctx: WorkflowContext) -> Any:
    kind, text = ctx.args["kind"], ctx.args.get("text", "")
    if kind == "step":
        return ctx.step("big", lambda: BIG)
    if kind == "log":
        ctx.log(BIG)
        return "logged"
    if kind == "agent":
        return {"agent": ctx.agent("make it big", label="big")}
    if kind == "branch":
        return ctx.parallel([lambda: BIG, lambda: "small"])
    if kind == "result":
        return BIG
    return text


@pytest.fixture
def d(durable: Any) -> Any:
    return durable([sizes], max_payload_bytes=LIMIT, agent_runner=FunctionRunner(default=lambda request: BIG))


def largest_value(raw: Any, prefix: str) -> int:
    """Bytes of the largest string value under ``prefix``, whatever the key type."""
    largest = 0
    for key in raw.scan_iter(match=f"{prefix}:*"):
        kind = raw.type(key)
        if kind == "hash":
            values = raw.hvals(key)
        elif kind == "stream":
            values = [v for _id, fields in raw.xrange(key) for v in fields.values()]
        elif kind == "string" and key.endswith(":archive"):
            values = [str(value) for value in raw.execute_command("GET", key, NEVER_DECODE=True)]  # zlib bytes
        elif kind == "string":
            values = [raw.get(key)]
        else:
            values = []
        largest = max([largest, *(len(v.encode()) for v in values)])
    return largest


@pytest.mark.parametrize(
    ("kind", "what"),
    [("step", "Step result"), ("log", "ctx.log message"), ("result", "Workflow result")],
)
def test_a_value_above_the_limit_fails_the_run_naming_the_limit(d: Any, raw_redis: Any, kind: str, what: str) -> None:
    envelope = d.client.run_workflow("sizes", args={"kind": kind}, timeout=TIMEOUT)
    assert envelope.status == "error"
    assert what in envelope.error and f"above max_payload_bytes ({LIMIT})" in envelope.error, envelope.error
    assert envelope.can_resume
    assert largest_value(raw_redis, d.settings.key_prefix) < LIMIT * 2


def test_an_agent_output_above_the_limit_is_a_failed_turn(d: Any, raw_redis: Any) -> None:
    envelope = d.client.run_workflow("sizes", args={"kind": "agent"}, timeout=TIMEOUT)
    assert (envelope.status, envelope.result) == ("completed", {"agent": None})
    (row,) = d.client.get_workflow_run_detail(envelope.run_id).agents
    assert row["status"] == "failed"
    assert f"above max_payload_bytes ({LIMIT})" in row["error"]
    assert largest_value(raw_redis, d.settings.key_prefix) < LIMIT * 2


def test_a_branch_result_above_the_limit_fills_its_slot_with_none(d: Any, raw_redis: Any) -> None:
    envelope = d.client.run_workflow("sizes", args={"kind": "branch"}, timeout=TIMEOUT)
    assert (envelope.status, envelope.result) == ("completed", [None, "small"])
    assert largest_value(raw_redis, d.settings.key_prefix) < LIMIT * 2


def test_args_above_the_limit_are_refused_before_a_run_exists(d: Any, raw_redis: Any) -> None:
    with pytest.raises(ValueError, match=rf"above max_payload_bytes \({LIMIT}\)"):
        d.client.start_workflow("sizes", args={"kind": "echo", "text": BIG})
    assert d.client.list_workflow_runs().runs == []
    small = d.client.run_workflow("sizes", args={"kind": "echo", "text": "é" * 500}, timeout=TIMEOUT)
    assert small.result == "é" * 500
