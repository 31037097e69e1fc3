"""Test your workflows in-process: no worker, no service to start.

``WorkflowTestEnvironment`` runs registered workflows through the engine
itself — its replay, its task bodies and its Lua scripts, on a private
redis-server it starts (``pip install 'celery-durable[testing]'`` where none
is installed) — with fan-outs run serially or in
threads, agents through a runner of your choice (``FunctionRunner``), and
crashes simulated at a chosen step so that a test can check what a resumed
run does and does not run again::

    env = WorkflowTestEnvironment([my_workflow], agent_runner=FunctionRunner(default=fake))
    env.crash_after("charge-card")
    assert env.run(my_workflow, args={...}).status == "running"   # the attempt died
    assert env.resume(run_id).status == "completed"               # charge-card not run again

With the pytest plugin (``testing/pytest_plugin.py``) a test asks for
``durable_env`` and gets a fresh one; ``durable_fleet`` runs real workers.

``crash_test(workflows, workflow, args, fakes=[...])`` kills a run at every
point a worker can die and reports which steps ran twice, and of them which
repeated a side effect on a ``Fake``: the ones that need an idempotency key.

``replay_history(workflow, history)`` replays a history a run left
(``Client.export_history``) against the code under test, so a change that
would break runs in flight fails a test before it is deployed.
"""

from celery_durable.testing.clock import VirtualClock
from celery_durable.testing.crash import SimulatedCrash
from celery_durable.testing.crash_test import CrashReport, Fake, crash_test
from celery_durable.testing.environment import WorkflowTestEnvironment
from celery_durable.testing.helpers import until_waiting_for_signal
from celery_durable.testing.mechanisms import Mechanisms
from celery_durable.testing.replay import replay_history

__all__ = [
    "CrashReport",
    "Fake",
    "Mechanisms",
    "SimulatedCrash",
    "VirtualClock",
    "WorkflowTestEnvironment",
    "crash_test",
    "replay_history",
    "until_waiting_for_signal",
]
