"""What the web view's tests share: workflows that hold where a test wants,
a hostile payload, polling with a deadline, and a real uvicorn server.

Workflows run in an in-process worker (tests/conftest.py), so a step can
block on a ``threading.Event`` the test opens: a run stays in the phase a
test is looking at for exactly as long as the test needs.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette

from celery_durable import define_workflow
from tests.support.poll import RUN_BOUND, poll

GATE_SECONDS = 30
"""How long a held step waits for its test before it fails (a safety net, not a pause)."""
XSS = '<script>window.__xss=1</script><img src=x onerror="window.__xss=2">'

_gates: dict[str, threading.Event] = {}
_gates_lock = threading.Lock()


def gate(gate_id: str) -> threading.Event:
    with _gates_lock:
        return _gates.setdefault(gate_id, threading.Event())


def open_all_gates() -> None:
    """Let every held step go, so a failed test leaves no run holding a worker."""
    with _gates_lock:
        for opened in _gates.values():
            opened.set()
        _gates.clear()


def new_gate() -> str:
    return uuid.uuid4().hex


def hold(ctx: Any, name: str) -> str:
    """A step body: wait until the test opens the gate named by ``ctx.args[name]``, or the run is cancelled."""
    opened = gate(ctx.args[name])
    deadline = time.monotonic() + GATE_SECONDS
    while not opened.wait(0.05):
        if ctx.cancelled():
            return "cancelled"
        if time.monotonic() > deadline:
            raise RuntimeError(f"the test never opened the gate {name}")
    return "opened"


def _gated(ctx: Any) -> Any:
    ctx.phase("Prepare")
    ctx.log("waiting at the first gate")
    ctx.step("first", lambda: hold(ctx, "first"))
    ctx.phase("Work")
    ctx.log(ctx.args.get("line", "through the first gate"))
    if "second" in ctx.args:
        ctx.step("second", lambda: hold(ctx, "second"))
    return {"done": True}


gated = define_workflow(
    {
        "name": "web.gated",
        "description": "Holds at gates the test opens",
        "phases": [{"title": "Prepare", "detail": "Wait for the first gate"}, {"title": "Work"}],
    },
    _gated,
)


def _hostile(ctx: Any) -> Any:
    ctx.phase("Prepare")
    ctx.log(XSS)
    value = ctx.step("payload", lambda: {"html": XSS})
    if "hold" in ctx.args:
        ctx.step("hold", lambda: hold(ctx, "hold"))
        ctx.log("live " + XSS)
    return value


hostile = define_workflow(
    {"name": "web.hostile", "description": "Logs and returns markup", "phases": [{"title": "Prepare"}]},
    _hostile,
)


def _quick(ctx: Any) -> Any:
    ctx.phase("Only")
    for index in range(int(ctx.args.get("lines", 1))):
        ctx.log(f"line {index + 1}")
    return ctx.step("answer", lambda: 42)


quick = define_workflow(
    {"name": "web.quick", "description": "Finishes at once", "phases": [{"title": "Only"}]},
    _quick,
)


def _approval(ctx: Any) -> Any:
    ctx.phase("Review")
    decision = ctx.wait_for_signal("approval")
    ctx.phase("Done")
    return {"payload": decision.payload}


approval = define_workflow(
    {
        "name": "web.approval",
        "description": "Waits for an approval signal",
        "phases": [{"title": "Review"}, {"title": "Done"}],
    },
    _approval,
)


def _waits_for_go(ctx: Any) -> Any:
    ctx.phase("Wait")
    signal = ctx.wait_for_signal("go")
    return {"payload": signal.payload}


waits_for_go = define_workflow(
    {"name": "web.waits-for-go", "description": "Waits for the signal go", "phases": [{"title": "Wait"}]},
    _waits_for_go,
)


def _parent(ctx: Any) -> Any:
    return {"child": ctx.child("kid", "web.waits-for-go")}


parent = define_workflow(
    {"name": "web.parent", "description": "Waits for a child run", "phases": []},
    _parent,
)

WORKFLOWS = [gated, hostile, quick, approval, waits_for_go, parent]


CSRF_PATTERN = re.compile(r'name="csrf_token" value="([^"]+)"')


def csrf_token(html: str) -> str:
    found = CSRF_PATTERN.search(html)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


@contextlib.contextmanager
def serving(app: Starlette) -> Iterator[str]:
    """``app`` under a real uvicorn server on a free loopback port, in a thread; yields its base URL.

    The socket is bound here and handed over, so no other process can take
    the port between choosing and listening.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="uvicorn-test")
    thread.start()
    try:
        poll(lambda: server.started or not thread.is_alive(), within=RUN_BOUND, what="uvicorn to start")
        assert thread.is_alive(), "uvicorn stopped while starting"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
