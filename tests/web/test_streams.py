"""Server-sent events over a real uvicorn server: what makes the pages live."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from celery_durable import Client
from celery_durable.web import create_app
from tests.support.poll import RUN_BOUND, poll
from tests.web.conftest import Site, SiteFactory, waiting
from tests.web.support import gate, new_gate, serving


def events(lines: Iterator[str]) -> Iterator[tuple[str, Any, str | None]]:
    """(event, data, id) of each message of an SSE stream."""
    name, data, event_id = "message", "", None
    for line in lines:
        if line == "":
            if data:
                yield name, json.loads(data), event_id
            name, data, event_id = "message", "", None
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = line[6:]
        elif line.startswith("id: "):
            event_id = line[4:]


@pytest.fixture
def base_url(site: SiteFactory) -> Iterator[tuple[Site, str]]:
    web = site()
    with serving(create_app(web.engine)) as url:
        yield web, url


def test_a_run_stream_sends_every_record_then_ends(base_url: tuple[Site, str]) -> None:
    web, url = base_url
    run = web.client.run_workflow("web.quick", args={"lines": 3}, timeout=20)
    with httpx.stream("GET", f"{url}/api/runs/{run.run_id}/events", params={"after_seq": 0}, timeout=10) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        received = list(events(response.iter_lines()))
    kinds = [name for name, _, _ in received]
    assert kinds[-1] == "end" and received[-1][1] == {"status": "completed"}
    progress = [(data, event_id) for name, data, event_id in received if name == "progress"]
    assert [data["seq"] for data, _ in progress] == list(range(1, len(progress) + 1))
    assert [event_id for _, event_id in progress] == [str(data["seq"]) for data, _ in progress]
    assert {"line 1", "line 2", "line 3"} <= {data["message"] for data, _ in progress}
    assert "run" in kinds


def test_a_reconnection_resumes_after_the_last_event_id(base_url: tuple[Site, str]) -> None:
    web, url = base_url
    run = web.client.run_workflow("web.quick", args={"lines": 3}, timeout=20)
    newest = web.client.get_workflow_run_progress(run.run_id).newest_seq
    assert newest is not None
    headers = {"Last-Event-ID": str(newest - 1)}
    with httpx.stream("GET", f"{url}/api/runs/{run.run_id}/events", headers=headers, timeout=10) as response:
        seqs = [data["seq"] for name, data, _ in events(response.iter_lines()) if name == "progress"]
    assert seqs == [newest]


def test_records_arrive_as_they_are_written(base_url: tuple[Site, str]) -> None:
    web, url = base_url
    held = new_gate()
    run_id = web.client.start_workflow("web.gated", args={"first": held, "line": "after the gate"})
    poll(
        lambda: web.client.get_workflow_run(run_id).snapshot["steps_running"],
        within=RUN_BOUND,
        what="the held step",
    )
    with httpx.stream("GET", f"{url}/api/runs/{run_id}/events", timeout=10) as response:
        seen: list[str] = []
        for name, data, _ in events(response.iter_lines()):
            if name == "progress":
                seen.append(data["message"])
                if data["message"] == "waiting at the first gate":
                    gate(held).set()  # written after the stream is open: it must arrive live
            if name == "end":
                break
    assert seen.index("waiting at the first gate") < seen.index("after the gate")


def test_a_run_that_settles_between_two_reads_of_the_stream_loses_no_record(
    base_url: tuple[Site, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's last records and its final status are written by one script:
    a stream that read the records, then saw the run settled, must read the
    records again before ``end``. The run is made to settle right after the
    stream's first read of its records (the signal it waits for is sent then)."""
    web, url = base_url
    run_id = waiting(web, "web.waits-for-go")
    read_progress = Client.get_workflow_run_progress
    armed = [True]

    def then_settle(self: Client, run: str, **options: Any) -> Any:
        page = read_progress(self, run, **options)
        if armed[0] and run == run_id:
            armed[0] = False
            self.signal_workflow_run(run_id, "go", 1)
            poll(lambda: self.get_workflow_run(run_id).is_terminal, within=RUN_BOUND, what="the run to settle")
        return page

    monkeypatch.setattr(Client, "get_workflow_run_progress", then_settle)
    with httpx.stream("GET", f"{url}/api/runs/{run_id}/events", params={"after_seq": 0}, timeout=30) as response:
        received = list(events(response.iter_lines()))
    assert not armed[0]
    assert received[-1] == ("end", {"status": "completed"}, None)
    streamed = [data["seq"] for name, data, _ in received if name == "progress"]
    monkeypatch.undo()
    newest = web.client.get_workflow_run_progress(run_id).newest_seq
    assert streamed == list(range(1, (newest or 0) + 1)), "every record once, in order, before end"


def test_the_namespace_stream_says_when_runs_change(base_url: tuple[Site, str]) -> None:
    web, url = base_url
    with httpx.stream("GET", f"{url}/api/events", timeout=10) as response:
        stream = events(response.iter_lines())
        assert next(stream)[0] == "ready"
        web.client.start_workflow("web.quick")
        assert next(stream)[0] == "runs"
