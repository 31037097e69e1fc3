"""The client's throttle methods (SPEC §5e), a base class of ``Client``.

Each checks and encodes with the pure functions of ``throttles``, does its
Redis I/O through the store, and decodes with ``throttles.decode_info``; a
slot a change frees goes to its waiters through ``throttling.after_admission``
(the one wake path).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from celery_durable import throttles
from celery_durable.broker.replies.throttles import Admission, Admitted
from celery_durable.errors import ThrottleNotFoundError
from celery_durable.tasks import throttling
from celery_durable.throttles import ThrottleInfo

if TYPE_CHECKING:
    from celery_durable.engine import Engine


class ThrottleMethods:
    """``set_throttle`` … ``delete_throttle`` of one namespace's client."""

    engine: Engine
    namespace: str

    def set_throttle(
        self,
        name: str,
        *,
        concurrency: int | None = None,
        rate: tuple[int, float] | None = None,
        per_key_concurrency: int | None = None,
        per_key_rate: tuple[int, float] | None = None,
    ) -> ThrottleInfo:
        """Create or replace a throttle; it applies at once to what waits (a
        raised limit hands its new slots to waiters immediately)."""
        throttles.check_throttle_name(name)
        settings = throttles.validate_settings(
            concurrency=concurrency, rate=rate, per_key_concurrency=per_key_concurrency, per_key_rate=per_key_rate
        )
        admitted = self.engine.store.throttle_set(self.namespace, name, settings.encode())
        throttling.after_admission(self.engine, self.namespace, name, admitted)
        return self.get_throttle(name)

    def get_throttle(self, name: str) -> ThrottleInfo:
        """A throttle's settings and state: slots held, waiters, top keys."""
        state = self.engine.store.throttle_read(self.namespace, self._existing_name(name), detail=True)
        if state is None:
            raise self._not_found(name)
        return throttles.decode_info(name, self.namespace, state)

    def list_throttles(self) -> list[ThrottleInfo]:
        """This namespace's throttles, by name (settings and counts)."""
        found = []
        for name in self.engine.store.throttle_names(self.namespace):
            state = self.engine.store.throttle_read(self.namespace, name)
            if state is not None:
                found.append(throttles.decode_info(name, self.namespace, state))
        return found

    def delete_throttle(self, name: str) -> None:
        """Delete a throttle: whatever waits on it goes on unthrottled."""
        waiters = self.engine.store.throttle_delete(self.namespace, self._existing_name(name))
        if waiters is None:
            raise self._not_found(name)
        throttling.after_admission(self.engine, self.namespace, name, Admitted(Admission.DELETED, waiters))

    def _existing_name(self, name: str) -> str:
        """``name``, where a throttle could have it: a name no throttle can
        have (``"no such!"``) is one that is not found, as a malformed run or
        schedule id is."""
        try:
            return throttles.check_throttle_name(name)
        except ValueError:
            raise self._not_found(name) from None

    def _not_found(self, name: object) -> ThrottleNotFoundError:
        return ThrottleNotFoundError(f"No throttle named {name!r} in namespace {self.namespace!r}")
