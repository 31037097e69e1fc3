"""Following a run in Flower: ``celery-durable flower`` and a ``celery-durable
worker`` as real processes, a real run, and Flower's REST API read the way
a dashboard would (/api/workers, /api/tasks)."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable import Engine, Settings
from tests.support.apps.phased import phased
from tests.support.fleet import ROOT, Fleet, settings_env
from tests.support.poll import RUN_BOUND, START_BOUND, poll

AUTH = ("watcher", "s3cret")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Flower:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, *, auth: bool = True) -> Any:
        request = urllib.request.Request(self.base + path)
        if auth:
            token = base64.b64encode(":".join(AUTH).encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(self.base + path, timeout=10) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)


@pytest.fixture
def flower(settings: Settings, tmp_path: Path) -> Iterator[Flower]:
    port = free_port()
    env = {**settings_env(settings), "FLOWER_BASIC_AUTH": ":".join(AUTH)}
    with open(tmp_path / "flower.log", "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "celery_durable", "flower",
                "--app", "tests.support.apps.phased:engine", f"--port={port}",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    try:
        yield Flower(port)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.mark.slow  # two processes to start: 7 s alone, past 10 s on a loaded machine
def test_a_run_can_be_followed_in_flower(settings: Settings, fleet: Fleet, flower: Flower) -> None:
    worker = fleet.start("tests.support.apps.phased:engine", name="flowerw")
    hostname = poll(
        lambda: [name for name in flower.get("/api/workers?refresh=1") if name.startswith("flowerw-")],
        within=START_BOUND,
        what="the worker in /api/workers",
        ignoring=(urllib.error.URLError, ConnectionError, TimeoutError),
    )[0]
    assert worker.alive()
    assert flower.status("/api/tasks") == 401, "the API is behind basic auth"

    envelope = Engine([phased], settings).client().run_workflow("phased", args={"pause": 0.1}, timeout=60)
    assert envelope.status == "completed"
    run_id = envelope.run_id

    def run_tasks() -> list[dict[str, Any]]:
        tasks = flower.get("/api/tasks?limit=1000").values()
        mine = [task for task in tasks if run_id in str(task.get("kwargs") or "")]
        done = [task for task in mine if task.get("state") == "SUCCESS"]
        names = sorted(task["name"] for task in done)
        # The coordinator's pass runs the first of three slow branches itself
        # and hands the other two on as tasks; the run goes on in that pass, or
        # in a second one their outcomes wake. Each shown as what it does for
        # which workflow (Celery's shadow name), and a branch task, once it has
        # run, after the one step it ran (flower_names).
        steps = [name for name in names if name.startswith("phased · step ")]
        coordinators = [name for name in names if name == "phased · coordinator"]
        ran = sorted(name.removeprefix("phased · step ") for name in steps)
        whole = len(steps) == 2 and len(coordinators) in (1, 2) and len(names) == len(steps) + len(coordinators)
        return done if whole and len(set(ran)) == 2 and set(ran) < {"square-1", "square-2", "square-3"} else []

    tasks = poll(
        run_tasks,
        within=RUN_BOUND,
        what="the run's tasks in /api/tasks",
        ignoring=(urllib.error.URLError, ConnectionError, TimeoutError),
    )
    for task in tasks:
        assert task["worker"] == hostname
        assert f"'run_id': '{run_id}'" in task["kwargs"]
        assert "'epoch': 1" in task["kwargs"] and "'workflow': 'phased'" in task["kwargs"]
        if "· step " in task["name"]:
            # The branch's sequence is where its step keys are journaled: Flower's search finds it; and its steps.
            assert "'call': 'm:1'" in task["kwargs"] and "'sequences': ['m.1." in task["kwargs"]
            step = task["name"].removeprefix("phased · step ")
            assert f"'steps': ['{step}']" in task["kwargs"]
    detail = flower.get(f"/api/task/info/{tasks[0]['uuid']}")
    assert detail["name"] == tasks[0]["name"] and run_id in detail["kwargs"]
    found = flower.get(f"/api/tasks?search={run_id}&limit=100")
    assert {task["uuid"] for task in tasks} <= set(found), "Flower's search finds a run's tasks by its id"
    found = flower.get("/api/tasks?search=m.1.2&limit=100")
    assert any(run_id in str(found[uuid].get("kwargs")) for uuid in found), "... and by a branch's sequence"


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "192.0.2.7"])
def test_an_exposed_flower_without_basic_auth_refuses_to_start(settings: Settings, address: str) -> None:
    """As ``web`` does: one line, exit 2, and no Flower listening (issue 25 item 12)."""
    env = {name: value for name, value in settings_env(settings).items() if name != "FLOWER_BASIC_AUTH"}
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "celery_durable", "flower", "--app", "tests.support.apps.phased:engine",
         f"--address={address}", f"--port={port}"],
        cwd=ROOT, env=env, capture_output=True, text=True,
        # A Flower that did start would serve until killed: it is killed after this long, and the test fails.
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"error: refusing to serve on {address} without a credential: pass --basic-auth user:password "
        "(or set FLOWER_BASIC_AUTH), or bind to 127.0.0.1"
    ]
