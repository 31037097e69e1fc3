"""The fleet registry against real worker processes (SPEC §3 ``list_workers``,
§11 ``fleet``): each worker publishes with its beat the queues it consumes
and the workflows it serves with their code hashes; a workflow served with
two hashes at once is a mixed deploy, named; a client whose engine lacks a
workflow reads its meta from the workers; a start that no live worker serves
leaves one system record saying so."""

from __future__ import annotations

import functools
import json
from typing import Any

from starlette.testclient import TestClient

from celery_durable import Engine, Settings, WorkerInfo, define_workflow
from celery_durable.client.fleet_registry import mixed_deploys
from celery_durable.web import create_app
from tests.support.apps.phased import phased
from tests.support.apps.versioned import ORDER, order_v1
from tests.support.cli import cli_process
from tests.support.fleet import Fleet
from tests.support.poll import RUN_BOUND, poll

APP = "tests.support.apps.versioned"
cli = functools.partial(cli_process, columns=200)


def reported(engine: Engine, *prefixes: str) -> list[WorkerInfo]:
    """The live workers named ``prefixes``, once each reported what it serves."""
    workers = [w for w in engine.client().list_workers() if w.alive and w.name.startswith(prefixes)]
    return workers if len(workers) == len(prefixes) and all(w.workflows for w in workers) else []


def test_workers_report_what_they_serve_and_a_mixed_deploy_is_named(settings: Settings, fleet: Fleet) -> None:
    fleet.start(f"{APP}:v1", name="regv1")
    fleet.start(f"{APP}:v2", name="regv2")
    client_engine = Engine([ORDER["v2"]], settings)
    workers = poll(
        lambda: reported(client_engine, "regv1", "regv2"),
        within=RUN_BOUND,
        what="both workers' reports",
    )
    by_name = {worker.name.partition("-")[0]: worker for worker in workers}
    assert by_name["regv1"].workflows == {"order": ORDER["v1"].code_hash}
    assert by_name["regv2"].workflows == {"order": ORDER["v2"].code_hash}
    assert settings.coordinator_queue in by_name["regv1"].queues
    assert settings.steps_queue in by_name["regv1"].queues
    assert by_name["regv1"].to_dict()["last_beat"].endswith("+00:00")

    [mixed] = mixed_deploys(client_engine.client().list_workers())
    assert mixed.workflow == "order"
    assert sorted(mixed.hashes) == sorted([ORDER["v1"].code_hash, ORDER["v2"].code_hash])
    assert [name.partition("-")[0] for name in mixed.hashes[ORDER["v1"].code_hash]] == ["regv1"]

    with TestClient(create_app(client_engine), base_url="http://127.0.0.1") as http:
        page = http.get("/ns/default/fleet").text
    assert 'mixed-deploy" data-workflow="order"' in page and "Mixed deploy of order" in page
    for version in ("v1", "v2"):
        assert f'data-workflow="order" data-code-hash="{ORDER[version].code_hash}"' in page

    shown = cli(settings, "fleet", "--app", f"{APP}:v2", "--json")
    assert shown.returncode == 0, shown.stderr
    data: dict[str, Any] = json.loads(shown.stdout)
    assert {w["name"].partition("-")[0] for w in data["workers"]} >= {"regv1", "regv2"}
    assert [d["workflow"] for d in data["mixed_deploys"]] == ["order"]
    table = cli(settings, "fleet", "--app", f"{APP}:v2")
    assert table.returncode == 0, table.stderr
    assert "Mixed deploy of order: 2 code versions" in table.stdout
    assert ORDER["v1"].code_hash[:12] in table.stdout and "regv1" in table.stdout


def test_a_start_no_live_worker_serves_says_so_once_and_meta_comes_from_the_workers(
    settings: Settings, fleet: Fleet
) -> None:
    fleet.start("tests.support.apps.phased:engine", name="regphased")
    invoice = define_workflow({"name": "invoice", "description": "no worker has it", "phases": []}, order_v1)
    client = Engine([invoice, phased], settings).client()
    poll(lambda: reported(client.engine, "regphased"), within=RUN_BOUND, what="the worker's report")

    unserved = client.start_workflow("invoice")
    served = client.start_workflow("phased", args={"pause": 0})
    # The live worker may have taken the run's message already and passed it
    # on, with a note of its own ("No worker that took its messages..."):
    # the start's note is the one said once.
    notes = [r.message for r in client.get_workflow_run_progress(unserved).records if r.kind == "system"]
    assert [note for note in notes if note.startswith("No live worker")] == [
        "No live worker serves workflow invoice: the run waits until a worker that registers it starts "
        "(celery-durable fleet lists what each worker serves)"
    ]
    assert client.get_workflow_run(unserved).status == "pending"
    events = client.get_workflow_run_history(unserved).events
    said = [(e.kind, str(e.data.get("message", ""))[:40]) for e in events]
    assert [(kind, text) for kind, text in said if text.startswith("No live worker")] == [
        ("note", "No live worker serves workflow invoice: ")
    ]
    assert client.wait_for_workflow_run(served, timeout=30).status == "completed"
    assert not any(
        "No live worker" in r.message for r in client.get_workflow_run_progress(served, limit=500).records
    )

    # A client (the web view's, the CLI's) whose engine does not register the workflow.
    blind = Engine([], settings).client()
    phases = blind.get_workflow_run_detail(served).phases
    assert [(p.title, p.detail, p.state) for p in phases] == [
        ("Fetch", "Read the inputs", "done"),
        ("Crunch", None, "done"),
        ("Report", "Write the summary", "done"),
    ]
    assert blind.workflow_meta("phased") is not None and blind.workflow_meta("nobody-has-it") is None
