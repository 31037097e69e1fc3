"""A user's suite run with ``-W error`` sees no warning from the package.

The project's own ``filterwarnings`` cannot show it (its ``celery.*``
pattern also matches ``celery_durable``), so the check runs in a fresh
interpreter with every warning an error.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

USER_TEST = textwrap.dedent(
    """
    from celery_durable import WorkflowContext, workflow
    from celery_durable.local.redis_server import answers_ping
    from celery_durable.testing import WorkflowTestEnvironment

    @workflow(name="hello", description="One step", phases=[])
    def hello(ctx: WorkflowContext) -> str:
        return ctx.step("greet", lambda: "hi")

    answers_ping(("127.0.0.1", 1))
    env = WorkflowTestEnvironment([hello])
    assert env.run("hello").result == "hi"
    print("ok")
    """
)


def test_the_testing_environment_warns_nothing_under_w_error() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", USER_TEST], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]
