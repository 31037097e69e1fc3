"""`openai` and `flower` are extras: one runner's and one command's
dependencies, not every worker's. Without them the package works, and the
one thing that needs each says which extra to install.

Each check runs in a fresh interpreter where the package cannot be imported
(``sys.modules[name] = None`` makes ``import name`` fail, as a missing
package does), so this environment's own install is left alone.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_the_openai_runner_without_the_openai_package_names_the_extra() -> None:
    done = _run(
        """
        import sys
        sys.modules["openai"] = None
        from celery_durable.agents import OpenAIChatRunner
        from celery_durable.agents.errors import AgentRunnerError
        try:
            OpenAIChatRunner(base_url="http://127.0.0.1:9/v1", api_key="x", model="m")
        except AgentRunnerError as exc:
            print(exc)
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pip install 'celery-durable[openai]'" in done.stdout


def test_the_flower_command_without_flower_names_the_extra() -> None:
    done = _run(
        """
        import sys
        sys.modules["flower"] = None
        from celery_durable.cli import main
        sys.argv = ["celery-durable", "flower", "--app", "tests.support.apps.basic:engine"]
        main()
        """
    )
    assert done.returncode != 0
    assert "pip install 'celery-durable[flower]'" in done.stdout + done.stderr


def test_an_engine_and_its_workflows_import_neither_openai_nor_flower() -> None:
    done = _run(
        """
        import sys
        sys.modules["openai"] = None
        sys.modules["flower"] = None
        import celery_durable
        from celery_durable.testing import WorkflowTestEnvironment
        from tests.support.apps.basic import engine
        print(sorted(engine.workflows)[:1])
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]

