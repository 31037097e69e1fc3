"""The engine: registered workflows, the Celery app that runs them, the store."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping, Sequence

from celery import Celery

from celery_durable.broker import RunStore
from celery_durable.client import Client
from celery_durable.config import Settings
from celery_durable.tasks.app import build_celery_app, register_tasks, send_branches, send_coordinator
from celery_durable.tasks.recovery import install as install_recovery
from celery_durable.workflows.definition import Workflow, check_unique_names


class Engine:
    """Workflows, settings and a Celery app configured for durability.

    Workers run ``engine.celery``; clients come from ``engine.client()``. The
    Redis client is made per process, after a prefork worker forks.
    """

    def __init__(self, workflows: Iterable[Workflow], settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.workflows: Mapping[str, Workflow] = check_unique_names(workflows)
        self.celery: Celery = build_celery_app(self.settings)
        register_tasks(self.celery, self)
        self._store: RunStore | None = None
        self._store_pid = 0
        self._lock = threading.Lock()
        self.refused_messages = 0
        install_recovery(self)

    @property
    def store(self) -> RunStore:
        pid = os.getpid()
        if self._store is None or self._store_pid != pid:
            with self._lock:
                if self._store is None or self._store_pid != pid:
                    self._store = RunStore(self.settings)
                    self._store_pid = pid
        return self._store

    @property
    def heartbeat_interval(self) -> float:
        """Beat often enough that a lease never lapses and a cancel is seen within a second."""
        return min(self.settings.lease_seconds / 3, 1.0)

    def client(self, namespace: str | None = None) -> Client:
        return Client(self, namespace or self.settings.namespace)

    def send_coordinator(self, run_id: str, epoch: int, workflow: str, countdown: float | None = None) -> None:
        send_coordinator(self.celery, self.settings, run_id, epoch, workflow, countdown)

    def send_branches(self, run_id: str, epoch: int, workflow: str, call: str, indices: Sequence[int]) -> None:
        send_branches(self.celery, self.settings, run_id, epoch, workflow, call, indices)

    def count_refused(self) -> None:
        """Count a task message refused by the fence (stale epoch or forged run)."""
        with self._lock:
            self.refused_messages += 1
