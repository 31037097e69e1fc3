"""Traces and metrics from real worker processes (docs/telemetry.md).

Spans are recorded by the OpenTelemetry SDK inside the workers
(``tests/support/apps/traced.py`` writes each ended span to a file); metrics are
scraped from a real prefork worker's ``--metrics-port``.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from starlette.testclient import TestClient

from celery_durable import Engine, Settings, WorkflowContext, telemetry, workflow
from celery_durable.local.redis_server import free_port
from celery_durable.telemetry.context import own_trace, parse_traceparent, run_parent
from celery_durable.web import create_app
from tests.conftest import DurableFactory
from tests.support.apps.traced import (
    counted,
    traced_call,
    traced_crash,
    traced_impatient,
    traced_kid,
    traced_parent,
    traced_unanswered,
    traced_waiting_kid,
)
from tests.support.fleet import ROOT, Fleet, settings_env
from tests.support.poll import RUN_BOUND, START_BOUND, poll

TRACED = "tests.support.apps.traced:engine"
CALLER = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, is_remote=True,
                     trace_flags=TraceFlags(1))


def spans_of(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def traced_worker(fleet: Fleet, tmp_path: Path, name: str, **options: Any) -> tuple[Any, Path]:
    spans = tmp_path / f"{name}.spans"
    env = {"TELEMETRY_SPANS": str(spans), "TELEMETRY_GATE": str(tmp_path)}
    return fleet.start(TRACED, name=name, env=env, **options), spans


def test_a_run_killed_and_recovered_is_one_trace_its_new_attempt_linked_to_the_old(
    settings: Settings, fleet: Fleet, tmp_path: Path
) -> None:
    client = Engine([traced_crash], settings).client()
    first, first_spans = traced_worker(fleet, tmp_path, "w1")
    run_id = client.start_workflow("traced_crash")  # this process traces nothing: the run's trace is its id
    poll(lambda: (tmp_path / "reached").exists(), within=RUN_BOUND, what="the gate step running")
    first.kill()
    (tmp_path / "open").touch()
    _, second_spans = traced_worker(fleet, tmp_path, "w2")
    envelope = client.wait_for_workflow_run(run_id, timeout=settings.lease_seconds * 6)
    assert envelope.status == "completed" and envelope.attempt == 2

    def ours(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [s for s in spans if s["attributes"].get("celery_durable.run_id") == run_id]

    poll(
        lambda: any(s["name"] == "celery_durable.pass" for s in ours(spans_of(second_spans))),
        within=RUN_BOUND,
        what="w2's pass span",
    )
    before, after = ours(spans_of(first_spans)), ours(spans_of(second_spans))
    assert {s["trace_id"] for s in before + after} == {run_id}, "one trace, named by the run id"
    assert {s["pid"] for s in before} != {s["pid"] for s in after}
    # The killed attempt's "before" step ended before the kill, so it was exported.
    (step,) = [s for s in before if s["name"] == "celery_durable.step"]
    assert step["attributes"]["celery_durable.key"] == "before" and step["attributes"]["celery_durable.attempt"] == 1
    (recovery,) = [s for s in before + after if s["name"] == "celery_durable.recovery"]
    root = own_trace(run_id)
    assert recovery["parent_id"] == f"{root.span_id:016x}"
    assert recovery["links"] == [{"trace_id": run_id, "span_id": f"{root.span_id:016x}"}], "linked to attempt 1"
    assert recovery["attributes"]["celery_durable.outcome"] == "recovered"
    passes = [s for s in after if s["name"] == "celery_durable.pass"]
    assert passes and all(s["attributes"]["celery_durable.attempt"] == 2 for s in passes)
    assert all(s["parent_id"] == recovery["span_id"] for s in passes), "attempt 2 hangs under its recovery"
    new_steps = {s["attributes"]["celery_durable.key"]: s for s in after if s["name"] == "celery_durable.step"}
    assert new_steps["before"]["attributes"]["celery_durable.journal"] == "hit"
    assert new_steps["gate"]["attributes"]["celery_durable.journal"] == "new"
    assert new_steps["after"]["attributes"]["celery_durable.journal"] == "new"


def test_a_called_task_is_a_child_of_its_call_in_the_callers_trace(
    settings: Settings, fleet: Fleet, tmp_path: Path
) -> None:
    client = Engine([traced_call], settings).client()
    _, spans_file = traced_worker(fleet, tmp_path, "w1")
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(CALLER)))
    try:
        run_id = client.start_workflow("traced_call", args={"x": 4})
    finally:
        otel_context.detach(token)
    assert client.wait_for_workflow_run(run_id, timeout=60).result == 9
    trace_id = f"{CALLER.trace_id:032x}"
    poll(
        lambda: any(s["name"] == "run/traced.double" for s in spans_of(spans_file)),
        within=RUN_BOUND,
        what="the task's span",
    )
    spans = [s for s in spans_of(spans_file) if s["trace_id"] == trace_id]
    by_id = {s["span_id"]: s for s in spans}

    def ancestors(span: dict[str, Any]) -> list[str]:
        names = []
        while span["parent_id"] in by_id:
            span = by_id[span["parent_id"]]
            names.append(span["name"])
        return names

    (call,) = [s for s in spans if s["name"] == "celery_durable.call"]
    assert call["attributes"]["celery_durable.key"] == "double" and call["kind"] == "PRODUCER"
    (task,) = [s for s in spans if s["name"] == "run/traced.double"]
    assert "celery_durable.call" in ancestors(task), "the instrumented task is a descendant of its ctx.call"
    passes = [s for s in spans if s["name"] == "celery_durable.pass"]
    assert len(passes) >= 1 and all(s["parent_id"] == f"{CALLER.span_id:016x}" for s in passes)
    assert ancestors(call)[0] == "celery_durable.pass"
    # The pass after the answer replays the call from the journal: no second call span.
    assert [s["name"] for s in spans].count("celery_durable.call") == 1


def scrape(port: int) -> str:
    """A worker's ``--metrics-port`` exposition, as Prometheus reads it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def metric(text: str, name: str, **labels: str) -> float:
    """The sample ``name{labels}`` in a Prometheus text exposition, 0 when absent."""
    for line in text.splitlines():
        found = re.match(r"([a-zA-Z_:][\w:]*)(\{[^}]*\})? ([^ ]+)", line)
        if found is None or found.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', found.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(found.group(3))
    return 0.0


def test_a_prefork_workers_metrics_count_the_runs_it_ran(settings: Settings, fleet: Fleet) -> None:
    port = free_port()
    engine = Engine([counted], settings)
    client = engine.client()
    fleet.start(TRACED, pool="prefork", concurrency=2, args=["--metrics-port", str(port), "--metrics-address",
                                                              "127.0.0.1"])
    runs = [client.start_workflow("counted") for _ in range(5)]
    for run_id in runs:
        assert client.wait_for_workflow_run(run_id, timeout=60).result == 3

    poll(
        lambda: metric(scrape(port), "celery_durable_runs_settled_total", workflow="counted", status="completed") == 5,
        within=RUN_BOUND,
        what="five settled runs counted",
    )
    text = scrape(port)
    assert metric(text, "celery_durable_runs_started_total", workflow="counted") == 5
    assert metric(text, "celery_durable_ops_journaled_total", workflow="counted", op="step", outcome="ok") == 15
    assert metric(text, "celery_durable_op_duration_seconds_count", workflow="counted", op="step") == 15
    assert metric(text, "celery_durable_waits_begun_total", workflow="counted", kind="timer") == 5
    assert metric(text, "celery_durable_tasks_total", workflow="counted", task="pass") >= 5
    assert metric(text, "celery_durable_queue_wait_seconds_count", task="coordinator") >= 5
    assert metric(text, "celery_durable_takeovers_total") == 0
    # The web view's /metrics reads the namespace's levels from storage.
    with TestClient(create_app(engine), base_url="http://127.0.0.1") as http:
        response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    assert metric(response.text, "celery_durable_runs", workflow="counted", status="completed") == 5
    assert metric(response.text, "celery_durable_runs_waiting", kind="timer") == 0


def test_a_metrics_port_in_use_stops_the_workers_start_with_a_clear_message(settings: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "celery_durable", "worker", "--app", TRACED, "--metrics-port", str(port),
             "--metrics-address", "127.0.0.1"],
            env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in done.stderr, done.stderr
    assert "another process" in done.stderr, done.stderr


def test_a_traceparent_that_does_not_parse_is_ignored_with_one_warning(
    settings: Settings, raw_redis: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    client = Engine([counted], settings).client()
    with caplog.at_level(logging.WARNING, logger="celery_durable.telemetry.context"):
        telemetry.carry_traceparent("00-not-a-trace-01", "the TRACEPARENT variable")
        run_id = client.start_workflow("counted")
    try:
        warnings = [r for r in caplog.records if "not a W3C traceparent" in r.getMessage()]
        assert len(warnings) == 1 and "TRACEPARENT" in warnings[0].getMessage()
        assert raw_redis.hget(f"{settings.key_prefix}:{{{run_id}}}:run", "trace_parent") is None
        assert client.get_workflow_run(run_id).status == "pending", "the start went on"
        # One carried correctly is recorded as it was given.
        telemetry.carry_traceparent(f"00-{'ab' * 16}-{'cd' * 8}-01", "the TRACEPARENT variable")
        second = client.start_workflow("counted")
        stored = raw_redis.hget(f"{settings.key_prefix}:{{{second}}}:run", "trace_parent")
        assert stored == f"00-{'ab' * 16}-{'cd' * 8}-01"
    finally:
        telemetry.carry_traceparent(None, "")
    # A stored one that does not parse (written by hand): the run's own trace, one warning per process.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="celery_durable.telemetry.context"):
        for _ in range(3):
            assert run_parent(run_id, "garbage-context-for-this-test") == own_trace(run_id)
    assert len([r for r in caplog.records if "garbage-context" in r.getMessage()]) == 1


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", True),
        ("00-0AF7651916CD43DD8448EB211C80319C-B7AD6B7169203331-00", True),
        ("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", True),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra", False),
        ("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", False),
        ("00-00000000000000000000000000000000-b7ad6b7169203331-01", False),
        ("00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", False),
        ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331", False),
        ("", False),
    ],
)
def test_traceparent_parsing(text: str, valid: bool) -> None:
    assert (parse_traceparent(text) is not None) is valid


def test_off_without_a_tracer_provider_nothing_is_observed_or_recorded(
    settings: Settings, raw_redis: redis.Redis
) -> None:
    """This test process configures no provider (and no metrics): the hooks' one check is None."""
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        pytest.skip("a tracer provider was configured in this process")
    client = Engine([counted], settings).client()
    run_id = client.start_workflow("counted")
    assert telemetry.refresh() is None and telemetry.observer is None
    assert raw_redis.hget(f"{settings.key_prefix}:{{{run_id}}}:run", "trace_parent") is None


def test_the_grafana_dashboard_charts_only_metrics_that_exist() -> None:
    from prometheus_client import CollectorRegistry

    from celery_durable.telemetry.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}
    exported = {family.name + end for family in registry.collect() for end in suffixes[family.type]}
    exported |= {"celery_durable_runs", "celery_durable_runs_waiting"}  # the web view's levels
    dashboard = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"celery_durable_\w+", target["expr"])
    }
    assert len(used) >= 10 and used <= exported, sorted(used - exported)


def test_a_workers_metrics_port_listens_on_loopback_by_default_and_logs_its_url(
    settings: Settings, fleet: Fleet
) -> None:
    psutil = pytest.importorskip("psutil")
    port = free_port()
    worker = fleet.start(TRACED, name="metricsdefault", args=["--metrics-port", str(port)])
    log = fleet.log_dir / "metricsdefault.log"
    poll(
        lambda: f"Prometheus metrics on http://127.0.0.1:{port}/metrics" in log.read_text(errors="replace"),
        within=START_BOUND,
        what="the worker's log naming its metrics URL",
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        assert answer.status == 200
    listening = [
        c.laddr for c in psutil.Process(worker.pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    ]
    assert [address.ip for address in listening] == ["127.0.0.1"], listening


def test_a_child_runs_spans_continue_its_parents_trace(settings: Settings, fleet: Fleet, tmp_path: Path) -> None:
    from celery_durable.broker.schema import child_run_id

    client = Engine([traced_parent, traced_kid], settings).client()
    _, spans = traced_worker(fleet, tmp_path, "wkid")
    run_id = client.start_workflow("traced_parent")  # this process traces nothing: the run's trace is its id
    assert client.wait_for_workflow_run(run_id, timeout=30).status == "completed"
    kid = child_run_id(run_id, "kid")

    def of(run: str) -> list[dict[str, Any]]:
        return [s for s in spans_of(spans) if s["attributes"].get("celery_durable.run_id") == run]

    poll(
        lambda: any(s["name"] == "celery_durable.step" for s in of(kid)),
        within=RUN_BOUND,
        what="the child's step span",
    )
    assert {s["trace_id"] for s in of(run_id)} == {run_id}
    assert {s["trace_id"] for s in of(kid)} == {run_id}, "the child continues its parent's trace"
    (start,) = [s for s in of(kid) if s["name"] == "celery_durable.start"]
    assert start["parent_id"] == f"{own_trace(run_id).span_id:016x}", "under the parent run's own anchor"


def test_a_child_reached_again_is_created_once_counted_once_and_started_once(
    settings: Settings, fleet: Fleet, tmp_path: Path
) -> None:
    """The parent's pass after the child's time-out reaches ``ctx.child`` again
    (and cancels the child): the child run exists, so nothing is started, counted
    or traced as a start a second time."""
    from celery_durable.broker.schema import child_run_id

    port = free_port()
    client = Engine([traced_impatient, traced_waiting_kid], settings).client()
    _, spans = traced_worker(fleet, tmp_path, "wimp", pool="prefork", concurrency=2, args=["--metrics-port", str(port)])
    run_id = client.start_workflow("traced_impatient")
    assert client.wait_for_workflow_run(run_id, timeout=RUN_BOUND).result == "ChildTimeout"
    kid = child_run_id(run_id, "kid")
    poll(lambda: client.get_workflow_run(kid).status == "cancelled", within=RUN_BOUND, what="the child cancelled")

    poll(
        lambda: metric(scrape(port), "celery_durable_runs_settled_total", workflow="traced_impatient") == 1,
        within=RUN_BOUND,
        what="the parent's settle counted",
    )
    assert metric(scrape(port), "celery_durable_runs_created_total", workflow="traced_waiting_kid") == 1
    starts = [
        s for s in spans_of(spans)
        if s["name"] == "celery_durable.start" and s["attributes"].get("celery_durable.run_id") == kid
    ]
    assert len(starts) == 1, starts


def test_a_call_that_times_out_counts_as_a_failed_call(settings: Settings, fleet: Fleet) -> None:
    """Its failure is journaled by the caller's pass (call.lua), not by an
    answer: it is an op whose outcome was produced there, outcome failed."""
    port = free_port()
    client = Engine([traced_unanswered], settings).client()
    fleet.start(TRACED, pool="prefork", concurrency=2, args=["--metrics-port", str(port)])
    run_id = client.start_workflow("traced_unanswered", args={"queue": f"{settings.key_prefix}.nobody"})
    assert client.wait_for_workflow_run(run_id, timeout=RUN_BOUND).result == "TaskTimeout"

    poll(
        lambda: metric(scrape(port), "celery_durable_runs_settled_total", workflow="traced_unanswered") == 1,
        within=RUN_BOUND,
        what="the run's settle counted",
    )
    text = scrape(port)
    assert metric(text, "celery_durable_ops_journaled_total", workflow="traced_unanswered", op="call") == 1
    assert metric(
        text, "celery_durable_ops_journaled_total", workflow="traced_unanswered", op="call", outcome="failed"
    ) == 1


@workflow(name="patient", description="Waits for a child run that waits for a signal", phases=[])
def patient(ctx: WorkflowContext) -> Any:
    return ctx.child("kid", traced_waiting_kid)


def test_runs_waiting_counts_the_runs_waiting_for_a_timer_or_a_signal(durable: DurableFactory) -> None:
    """A parent waiting for its child waits for fleet work, not for the outside
    world: only its child, waiting for a signal, is counted (kinds timer, signal)."""
    from celery_durable.broker.schema import child_run_id

    setup = durable([patient, traced_waiting_kid])
    run_id = setup.client.start_workflow("patient")
    kid = child_run_id(run_id, "kid")

    def waits(run: str) -> str | None:
        waiting = setup.client.get_workflow_run(run).snapshot.get("waiting_for")
        return waiting["kind"] if waiting else None

    poll(lambda: waits(run_id) == "child" and waits(kid) == "signal", within=RUN_BOUND, what="both runs waiting")
    with TestClient(create_app(setup.engine), base_url="http://127.0.0.1") as http:
        text = http.get("/metrics").text
    kinds = dict(re.findall(r'celery_durable_runs_waiting\{kind="(\w+)",namespace="default"\} (\S+)', text))
    assert kinds == {"signal": "1.0", "timer": "0.0"}


TAKE_OVER_REFUSED = """
import json
from opentelemetry import trace
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

started, ended = [], []


class Track(SpanProcessor):
    def on_start(self, span, parent_context=None):
        started.append(span.name)

    def on_end(self, span):
        ended.append([span.name, dict(span.attributes)])


provider = TracerProvider()
provider.add_span_processor(Track())
trace.set_tracer_provider(provider)

from celery_durable import Engine
from celery_durable.tasks.recovery import take_over
from tests.support.apps.traced import counted

engine = Engine([counted])
run_id = engine.client().start_workflow("counted")
take_over(engine, engine.store.load_run(run_id), "judged dead by another sweeper")
print(json.dumps({"status": engine.store.load_run(run_id).status, "started": started, "ended": ended}))
"""


def test_a_halt_the_script_refuses_still_ends_its_recovery_span(settings: Settings) -> None:
    """With auto_recover off, a take-over whose halt the script refuses (the
    run is not dead after all, or another sweeper acted) ends its span as
    ``lost``, as the recovering path does: no span is left open."""
    env = {**settings_env(settings), "CELERY_DURABLE_AUTO_RECOVER": "false"}
    done = subprocess.run(
        [sys.executable, "-c", TAKE_OVER_REFUSED], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=START_BOUND,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["status"] == "pending", "its first message is in flight: nothing to halt"
    assert sorted(seen["started"]) == sorted(name for name, _ in seen["ended"]), "every span started was ended"
    (recovery,) = [attributes for name, attributes in seen["ended"] if name == "celery_durable.recovery"]
    assert recovery["celery_durable.outcome"] == "lost"
