"""A caller that dies between a script that counted a wake and the wake's
publish (issue 35): the run still receives what was asked (SPEC §3: a
signal, cancel or pause is durable before anything is published for it).

The caller is a real process whose every publish ends it (``os._exit``), as a
client killed at that instant would. The run waited with nothing due, so
the sweep no longer watched it; what brings it back is the look the store
scheduled before the script counted the wake (``store_core.LOOK_FIRST``).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from celery_durable import Settings
from celery_durable.broker.ops import SCRIPT_NAMES, WAKING_SCRIPTS
from celery_durable.broker.store_core import LOOK_FIRST, WATCHED_CALLERS
from celery_durable.errors import StorageUnavailableError
from celery_durable.testing.crash import SimulatedCrash
from celery_durable.testing.explorer import ExplorerEnvironment
from celery_durable.testing.tracer import Tracer
from tests.conftest import DurableFactory
from tests.support.apps.waits import await_signal
from tests.support.waits import waiting_for_the_signal

DIES_AT_PUBLISH = 3
PACKAGE = Path(__file__).resolve().parent.parent / "celery_durable"

CALLER = textwrap.dedent(
    """
    import os, sys
    from celery_durable import Engine, Settings
    from tests.support.apps.waits import await_signal

    settings = Settings.model_validate_json(sys.argv[1])
    engine = Engine([await_signal], settings)

    def die(*_args, **_kwargs):
        os._exit({code})

    engine.sender.send = die
    engine.sender.send_call = die
    client = engine.client()
    if sys.argv[3] == "signal":
        client.signal_workflow_run(sys.argv[2], "go", {{"by": "ops"}})
    else:
        client.cancel_workflow_run(sys.argv[2], timeout=1)
    os._exit(0)
    """
).format(code=DIES_AT_PUBLISH)


def _caller_dies(settings: Settings, run_id: str, request: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CALLER, settings.model_dump_json(), run_id, request],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == DIES_AT_PUBLISH, f"the caller did not die at its publish: {done.stderr[-2000:]}"


def _deadline(settings: Settings) -> float:
    """A look a lease later, the counted message found gone (a queue seen
    empty two seconds after it was due, then five to start), a take-over, a
    pass: about three leases; six allow a loaded machine."""
    return 6 * settings.lease_seconds + 10


@pytest.mark.parametrize("request_kind", ["signal", "cancel"])
def test_a_run_whose_caller_dies_at_the_publish_goes_on_by_itself(durable: DurableFactory, request_kind: str) -> None:
    d = durable([await_signal])
    run_id = d.client.start_workflow("await-signal")
    waiting_for_the_signal_go(d, run_id)
    _caller_dies(d.settings, run_id, request_kind)
    done = d.client.wait_for_workflow_run(run_id, timeout=_deadline(d.settings))
    if request_kind == "signal":
        assert (done.status, done.result) == ("completed", {"before": "journaled", "payload": {"by": "ops"}})
    else:
        assert done.status == "cancelled"
    assert done.attempt == 2, "taken over by the sweep, which found the counted message gone"


@pytest.mark.parametrize("lost", ["caller dies", "broker refuses"])
@pytest.mark.parametrize("request_kind", ["signal", "cancel", "pause"])
def test_without_auto_recovery_a_lost_request_wake_is_sent_again_and_the_run_is_not_halted(
    monkeypatch: pytest.MonkeyPatch, request_kind: str, lost: str
) -> None:
    """With auto_recover off, a healthy run whose request's wake never reached
    the broker is no attempt that died (SPEC §8): the sweep sends the main
    body's wake again at the same epoch, and the run still receives the request
    within a few leases (SPEC §3), never halted. In-process, on the explorer's
    virtual clock, with the real sweep and scripts."""
    monkeypatch.setenv("CELERY_DURABLE_AUTO_RECOVER", "false")
    env = ExplorerEnvironment([await_signal], Tracer())
    assert env.settings.auto_recover is False
    run_id = env.client.start_workflow(await_signal)
    assert env.recover(lambda: env.waits_for_signal(run_id)) and env.status(run_id) == "running"

    def publish(_messages: object) -> None:
        raise SimulatedCrash() if lost == "caller dies" else OSError("the broker refuses")

    monkeypatch.setattr(env.engine.sender, "send", publish)
    with pytest.raises(SimulatedCrash if lost == "caller dies" else StorageUnavailableError):
        if request_kind == "signal":
            env.client.signal_workflow_run(run_id, "go", {"by": "ops"})
        elif request_kind == "cancel":
            env.client.cancel_workflow_run(run_id, timeout=1)
        else:
            env.client.pause_workflow_run(run_id, timeout=1)
    monkeypatch.undo()  # the broker is back; nobody sends the request again

    # A look within a lease finds the counted wake gone from its queue, five seconds later lost.
    assert env.recover(lambda: env.settled(run_id), leases=2), env.status(run_id)
    done = env.client.get_workflow_run(run_id)
    expected = {"signal": "completed", "cancel": "cancelled", "pause": "paused"}[request_kind]
    assert (done.status, done.attempt) == (expected, 1), (done.status, done.error)
    if request_kind == "signal":
        assert done.result == {"before": "journaled", "payload": {"by": "ops"}}
    system = [r.message for r in env.client.get_workflow_run_progress(run_id).records if r.kind == "system"]
    assert not [m for m in system if "halted" in m or "recovered" in m], system


def waiting_for_the_signal_go(d: object, run_id: str) -> None:
    """Until the sweep no longer watches the run: only the signal brings it back."""
    waiting_for_the_signal(d, run_id, name="go")


def test_every_script_that_counts_a_wake_has_its_look_first_or_a_watched_caller() -> None:
    """``LOOK_FIRST`` is derived: a script that counts a wake (read from the
    Lua) has the look first unless its callers are named as watched."""
    assert set(SCRIPT_NAMES) >= WAKING_SCRIPTS
    assert set(WATCHED_CALLERS) <= WAKING_SCRIPTS, "a watched caller named for a script that counts no wake"
    assert WAKING_SCRIPTS - set(WATCHED_CALLERS) == LOOK_FIRST
    for outside in ("signal", "cancel", "pause", "child_done", "call_done", "create_run", "resume"):
        assert outside in LOOK_FIRST, outside


def _store_methods_running(scripts: frozenset[str]) -> set[str]:
    """The store's methods that run one of ``scripts`` (``self.call("name", …)``)."""
    methods: set[str] = set()
    for path in (PACKAGE / "broker").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr in ("_run", "_run_each", "call", "call_each", "_call")
                    and call.args
                    and isinstance(call.args[0], ast.Constant)
                    and call.args[0].value in scripts
                ):
                    methods.add(node.name)
    return methods


def test_every_wake_counted_from_outside_a_run_is_sent_by_deliver() -> None:
    """A module that runs a script of ``LOOK_FIRST`` (a signal, a cancel, a
    child's end, a start, a take-over…) sends what it woke through
    ``Engine.deliver`` alone, never a sender of its own."""
    methods = _store_methods_running(LOOK_FIRST)
    assert {"signal", "cancel", "tell_parent", "create_run", "resume"} <= methods
    callers = []
    for path in PACKAGE.rglob("*.py"):
        if "broker" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
        called = {func.attr for func in calls if isinstance(func, ast.Attribute)}
        on_store = {
            func.attr for func in calls if isinstance(func, ast.Attribute) and ast.unparse(func.value).endswith("store")
        }
        if on_store & methods:
            callers.append(path.relative_to(PACKAGE))
            around = called & {"send_coordinator", "send_branches", "send_agent", "_publish", "send"}
            assert not around, f"{path.relative_to(PACKAGE)} counts wakes and sends them around deliver: {around}"
    assert len(callers) >= 4, callers
