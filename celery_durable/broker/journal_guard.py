"""A ``Journal`` that passes every call of another through one function.

Replay's sticky journal (a lost execution stays lost) and the test
environment's crashing one (an attempt dies at a chosen step) are wrappers
of the store's journal. Written out method by method, each restated the
whole protocol, and every journaled write the engine gained had to be added
to both. ``GuardedJournal`` takes its methods from the protocol itself: a
method ``Journal`` declares is forwarded through ``around``; a name it does
not declare is an ``AttributeError``, as on the store's journal, never
passed through unguarded. A wrapper adds behaviour to a method by defining
it (``testing/crash.py``), not by restating the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_durable.broker.journal import Journal

Around = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
"""Runs one call of the inner journal: (its bound method, args, kwargs) -> its answer."""

JOURNAL_CALLS = frozenset(
    name for name, member in vars(Journal).items() if callable(member) and not name.startswith("_")
)
"""The methods of the ``Journal`` protocol (its properties are not calls)."""


class GuardedJournal:
    """Every method of ``Journal``, forwarded to ``inner`` through ``around``."""

    def __init__(self, inner: Journal, around: Around) -> None:
        self._inner = inner
        self._around = around

    @property
    def run_id(self) -> str:
        return self._inner.run_id

    @property
    def epoch(self) -> int:
        return self._inner.epoch

    def __getattr__(self, name: str) -> Any:
        # Reached only for names the class does not define: the protocol's
        # methods this wrapper adds nothing to.
        if name not in JOURNAL_CALLS:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}: Journal declares no such method")
        method = getattr(self._inner, name)
        around = self._around

        def guarded(*args: Any, **kwargs: Any) -> Any:
            return around(method, args, kwargs)

        guarded.__name__ = name
        self.__dict__[name] = guarded  # found directly from now on
        return guarded
