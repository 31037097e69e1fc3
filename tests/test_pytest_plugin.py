"""The pytest plugin, as a user's test suite meets it: pytester runs small
test files in a fresh pytest process and we read its outcomes."""

from __future__ import annotations

import importlib.metadata
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "celery_durable.testing.pytest_plugin"

WORKFLOWS = '''
from celery_durable import define_workflow

def reminders(ctx):
    ctx.sleep(86_400)                                   # a day, virtual in-process
    decision = ctx.wait_for_signal("approval", timeout=3_600)
    return ctx.step("outcome", lambda: {"received": decision.received, "payload": decision.payload})

approval = define_workflow(
    meta={"name": "plugin-approval", "description": "Waits a day, then for an approval", "phases": []},
    run=reminders,
)

def waits(ctx):
    got = ctx.wait_for_signal("go")
    return ctx.step("done", lambda: got.payload)

gate = define_workflow(meta={"name": "plugin-gate", "description": "Waits for go", "phases": []}, run=waits)
'''

CONFTEST = """
import pytest
from flows import approval, gate

@pytest.fixture
def durable_workflows():
    return [approval, gate]
"""


def _plugin_args() -> list[str]:
    """Load the plugin by name unless its entry point already does (an installed checkout)."""
    names = {entry.name for entry in importlib.metadata.entry_points(group="pytest11")}
    return [] if "celery_durable" in names else ["-p", PLUGIN]


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*_plugin_args(), "-p", "no:cacheprovider", "-p", "no:xdist", *args)


def test_the_entry_point_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"celery_durable": PLUGIN}


def test_in_process_fixtures_time_travel_and_signals(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(flows=WORKFLOWS)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_user=textwrap.dedent(
            """
            from celery_durable.testing import until_waiting_for_signal

            def test_a_day_of_virtual_time(durable_env, durable_clock):
                assert durable_clock is durable_env.clock
                start = durable_clock.now_ms()                         # before the timer is set
                run_id = durable_env.start("plugin-approval")
                assert durable_env.get(run_id).snapshot["waiting_for"]["kind"] == "timer"
                envelope = durable_env.skip_to_next_timer(run_id)        # the day passes
                assert 86_400_000 <= durable_clock.now_ms() - start < 86_460_000   # not a minute more
                assert envelope.snapshot["waiting_for"]["name"] == "approval"
                until_waiting_for_signal(durable_env.client, run_id, "approval")
                assert durable_env.signal(run_id, "approval", {"ok": True}).status == "completed"

            def test_the_signal_times_out(durable_env):
                run_id = durable_env.start("plugin-approval")
                durable_env.skip_to_next_timer(run_id)
                envelope = durable_env.skip_to_next_timer(run_id)        # the hour-long wait's time-out
                assert envelope.result == {"received": False, "payload": None}

            def test_each_test_gets_a_fresh_environment(durable_env):
                assert durable_env.client.list_workflow_runs().runs == []
                durable_env.start("plugin-gate")

            def test_and_this_one_too(durable_env):
                assert durable_env.client.list_workflow_runs().runs == []

            def test_no_timer_to_skip_to(durable_env):
                import pytest
                run_id = durable_env.start("plugin-gate")
                with pytest.raises(ValueError, match="waits for no timer"):
                    durable_env.skip_to_next_timer(run_id)
            """
        )
    )
    result = _run(pytester)
    result.assert_outcomes(passed=5)


def test_without_workflows_the_fixture_says_what_to_do(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user="def test_needs_env(durable_env):\n    pass\n")
    result = _run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*define a `durable_workflows` fixture*"])


def test_a_real_fleet_in_subprocesses_killed_by_pid(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(flows=WORKFLOWS + "\nfrom celery_durable import Engine\nengine = Engine([approval, gate])\n")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_fleet=textwrap.dedent(
            """
            import os
            from celery_durable.testing import until_waiting_for_signal

            def test_a_run_outlives_its_worker(durable_fleet, durable_client):
                first = durable_fleet.start("flows:engine")
                run_id = durable_client.start_workflow("plugin-gate")
                until_waiting_for_signal(durable_client, run_id, "go")
                first.kill()                                    # SIGKILL, by its own pid
                assert not first.alive()
                durable_fleet.start("flows:engine", name="second")
                durable_client.signal_workflow_run(run_id, "go", 42)
                envelope = durable_client.wait_for_workflow_run(run_id, timeout=60)
                assert envelope.status == "completed" and envelope.result == 42

            def test_an_in_thread_worker(durable_worker, durable_client):
                run_id = durable_client.start_workflow("plugin-gate")
                until_waiting_for_signal(durable_client, run_id)
                durable_client.signal_workflow_run(run_id, "go", "yes")
                assert durable_client.wait_for_workflow_run(run_id, timeout=60).result == "yes"
            """
        )
    )
    result = _run(pytester, "-x")
    result.assert_outcomes(passed=2)
