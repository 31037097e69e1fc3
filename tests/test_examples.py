"""The examples, each run with the README's ``celery-durable run`` line, on
a fresh machine's terms: no Redis configured, none on localhost:6379 — so the
command starts a private Redis and a worker process itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from celery_durable import FunctionRunner, OpenAIChatRunner, Settings
from tests.support.readme import readme_example_lines, run_fresh


def run_readme_example(tmp_path: Path, workflow: str) -> dict[str, Any]:
    """The README's line for ``workflow``, with ``--json``; the final envelope."""
    (argv,) = [argv for argv in readme_example_lines() if argv[:3] == ["celery-durable", "run", workflow]]
    done = run_fresh(tmp_path, *argv[1:], "--json")
    assert done.returncode == 0, done.stderr + done.stdout
    assert "started a private redis-server" in done.stderr
    assert (tmp_path / ".celery-durable" / "redis" / "appendonlydir").is_dir()
    if "--follow" in argv:  # JSON lines: progress records, then the run
        lines = [json.loads(line) for line in done.stdout.splitlines()]
        assert any(line["type"] == "progress" for line in lines)
        envelope: dict[str, Any] = lines[-1]["run"]
    else:
        envelope = json.loads(done.stdout)
    assert envelope["status"] == "completed", envelope
    return envelope


def test_the_readme_runs_every_example() -> None:
    assert sorted(argv[2] for argv in readme_example_lines()) == [
        "code-review", "expense-approval", "nightly-report", "pipeline", "trip"
    ]


def test_the_trip(tmp_path: Path) -> None:
    result = run_readme_example(tmp_path, "trip")["result"]
    assert result["status"] == "confirmed"
    assert [b["service"] for b in result["bookings"]] == ["flight", "hotel", "car"]
    assert all(b["confirmation"] and b["destination"] == "Seattle" for b in result["bookings"])


def test_the_code_review_finds_the_seeds_two_bugs(tmp_path: Path) -> None:
    result = run_readme_example(tmp_path, "code-review")["result"]
    assert (result["files"], result["reviewed"], result["bugs"]) == (2, 2, 2)
    by_file = {finding["file"]: finding for finding in result["findings"]}
    assert "initial value" in by_file["cart.js"]["message"]
    assert by_file["cart.js"]["fix"].endswith(", 0);")
    assert by_file["discount.js"]["fix"] == "return price * (1 - percent / 100);"


def test_the_expense_approval_expires_on_its_own_when_nobody_decides(tmp_path: Path) -> None:
    result = run_readme_example(tmp_path, "expense-approval")["result"]
    assert result["status"] == "expired"
    assert result["claim"].startswith("EXP-")


def test_the_pipeline(tmp_path: Path) -> None:
    result = run_readme_example(tmp_path, "pipeline")["result"]
    assert (result["documents"], result["processed"]) == (4, 4)
    assert [s["document"] for s in result["summaries"]] == ["fencing", "seed", "spec", "steps"]


def test_the_nightly_report_composes_child_runs(tmp_path: Path) -> None:
    envelope = run_readme_example(tmp_path, "nightly-report")
    result = envelope["result"]
    assert (result["customers"], result["reported"]) == (3, 2)
    by_customer = {report["customer"]: report for report in result["reports"]}
    assert by_customer["empty-co"] == {"customer": "empty-co", "failed": "error"}
    assert result["total"] == by_customer["acme"]["total"] + by_customer["globex"]["total"] > 0


@pytest.mark.parametrize(
    ("settings", "runner"),
    [
        (Settings(), FunctionRunner),
        (Settings(openai_model="qwen2.5:7b", openai_base_url="http://localhost:11434/v1"), OpenAIChatRunner),
        (Settings(agent_runner="tests.support.apps.agents:engine"), type(None)),
    ],
)
def test_the_code_review_uses_an_openai_endpoint_only_when_one_is_configured(
    settings: Settings, runner: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    from examples.code_review import reviewer_runner

    for name, value in settings.model_dump(exclude_none=True).items():
        if name in {"openai_model", "openai_base_url"}:
            monkeypatch.setenv(f"CELERY_DURABLE_{name.upper()}", str(value))
    monkeypatch.setenv("CELERY_DURABLE_OPENAI_API_KEY", "local-servers-take-any-key")
    assert isinstance(reviewer_runner(settings), runner)
