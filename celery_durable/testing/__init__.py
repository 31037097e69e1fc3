"""Test your workflows in-process: no Redis, no worker.

``WorkflowTestEnvironment`` runs registered workflows on the in-memory
journal through the engine's own replay, with fan-outs run serially or in
threads, agents through a runner of your choice (``FunctionRunner``), and
crashes simulated at a chosen step so that a test can check what a resumed
run does and does not run again::

    env = WorkflowTestEnvironment([my_workflow], agent_runner=FunctionRunner(default=fake))
    env.crash_after("charge-card")
    assert env.run(my_workflow, args={...}).status == "running"   # the attempt died
    assert env.resume(run_id).status == "completed"               # charge-card not run again
"""

from celery_durable.testing.clock import VirtualClock
from celery_durable.testing.crash import SimulatedCrash
from celery_durable.testing.environment import WorkflowTestEnvironment

__all__ = ["SimulatedCrash", "VirtualClock", "WorkflowTestEnvironment"]
