"""Real worker processes for crash tests, run from this repository (``celery_durable.testing.workers``).

Each worker runs in its own process group (start_new_session), so SIGKILL,
SIGSTOP and SIGCONT reach its prefork children too, and nothing is ever
signalled by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable import Settings
from celery_durable.testing import workers

ROOT = Path(__file__).resolve().parents[2]


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a worker process use ``settings``."""
    return workers.settings_env(settings, ROOT)


class WorkerProcess(workers.WorkerProcess):
    """One ``celery-durable worker`` process (and its children), run from the repository."""

    def __init__(self, settings: Settings, app: str, **options: Any) -> None:
        super().__init__(settings, app, root=ROOT, **options)


class Fleet(workers.WorkerFleet):
    """Every worker process a test started; all are gone after the test."""

    def __init__(self, settings: Settings, log_dir: Path) -> None:
        super().__init__(settings, log_dir, ROOT)


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[Fleet]:
    group = Fleet(settings, tmp_path)
    yield group
    group.close()
