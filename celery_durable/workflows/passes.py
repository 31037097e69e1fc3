"""One execution of a workflow function, and how it ends: the pass logic.

``main_pass`` runs the main body once (a coordinator pass) and says how the
run settles, or that it waits; ``branch_pass`` replays the main body up to a
fan-out and runs a branch task's own thunks. Neither knows Celery nor Redis:
the Celery tasks (``tasks/``) and the in-process test environment
(``celery_durable.testing``) both drive runs through them, so a run settles
the same way whichever drives it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery_durable.broker import schema
from celery_durable.broker.journal import LastWrites
from celery_durable.errors import (
    FATAL_ERRORS,
    NonDeterminismError,
    StaleAttemptError,
    StepFailed,
    StorageCorruptError,
    StorageUnavailableError,
    WorkflowCancelled,
    WorkflowLimitReached,
)
from celery_durable.workflows import jsonvalue
from celery_durable.workflows.branches import run_kept
from celery_durable.workflows.completion import Completions
from celery_durable.workflows.context import WorkflowContext
from celery_durable.workflows.cursor import Cursor
from celery_durable.workflows.replay import MAIN, Replay
from celery_durable.workflows.stopping import Mode
from celery_durable.workflows.unwind import BranchFinished, PauseRequested, Suspend, unwound
from celery_durable.workflows.versions import note_code

if TYPE_CHECKING:
    from celery_durable.workflows.branch_work import KeptFanout


@dataclass(frozen=True, slots=True)
class Settlement:
    """How a pass that did not suspend ends the run."""

    status: str
    reason: str = ""
    error: str = ""
    can_resume: bool = False
    result_json: str | None = None
    message: str = ""
    last: LastWrites | None = field(default=None, compare=False)
    """The main body's writes not made yet, which go out with the settlement."""
    flushed: Callable[[], Settlement | None] | None = field(default=None, compare=False)
    """Should the settlement not take ``last``: write them as a pass that does
    not settle, and decide again (None: the pass runs again)."""

    def written(self) -> dict[str, Any]:
        """What ``RunStore.finish`` writes of it besides its status."""
        return {
            "reason": self.reason,
            "error": self.error,
            "can_resume": self.can_resume,
            "result_json": self.result_json,
            "message": self.message,
            "last": self.last,
        }


def settled(settlement: Settlement, finish: Callable[[Settlement], bool]) -> Settlement | None:
    """Settle the run with ``finish`` (True: it settled); a settlement whose
    last writes came back is decided again once they are made, and that one
    settles. The settlement that did, or None when the pass runs again (its
    last step lost a first-write race)."""
    if finish(settlement):
        return settlement
    assert settlement.flushed is not None
    again = settlement.flushed()
    if again is not None:
        finish(again)
    return again


CANCELLED = Settlement("cancelled", reason="cancelled", error="Cancelled by request", message="Run cancelled")
PAUSED = Settlement("paused", "paused", "Paused by request", True, message="Run paused")


def corrupt(error: StorageCorruptError) -> Settlement:
    """A run whose journal holds what celery-durable did not write stops, resumably:
    once the entry is repaired (or deleted, so that its op runs again),
    ``resume_workflow`` replays the run from its journal."""
    return Settlement("error", "workflow_storage_corrupt", str(error), True, message="Run stopped: storage corrupt")


def main_pass(replay: Replay) -> Settlement | None:
    """Run the main body once; the settlement, or None when the run waits.

    Raises what ends this execution without settling the run: a lost
    authority (``StaleAttemptError``), an unavailable store, a corrupt one.
    """
    if replay.cancelled() and not replay.run.compensates:
        return CANCELLED  # else it replays to where it stands, and its sagas compensate there
    if replay.mode is Mode.PASS:
        note_code(replay)
    cursor = replay.open_cursor(MAIN, writes=True)
    result: Any = None
    failure: Exception | None = None
    try:
        with replay.running(cursor):
            result = replay.workflow.run(WorkflowContext(replay))
    except Suspend as waiting:
        unwound(waiting)
        return None
    except PauseRequested as pausing:
        unwound(pausing)
    except (StaleAttemptError, StorageUnavailableError):
        raise
    except Exception as exc:
        failure = exc
    if replay.unwinding is not None and not isinstance(replay.unwinding, PauseRequested):
        return None  # user code swallowed the Suspend; the pass ends here all the same
    if replay.broken is not None:
        raise replay.broken
    # Its progress and the step it ran last go out with the settlement, in
    # finish.lua; a cancel that came meanwhile, or a first write lost, sends
    # them back to go out first as they would in a pass that did not settle,
    # and the settlement is decided again (``_flushed``).
    try:
        last = replay.last_writes(cursor)
    except Suspend as rerun:
        unwound(rerun)
        return None  # that step lost a first-write race: the pass runs again
    except NonDeterminismError as exc:
        failure, last = exc, None
    settlement = _decided(replay, result, failure)
    if last is None:
        return settlement
    again = functools.partial(_flushed, replay, cursor, last, result, failure)
    return dataclasses.replace(settlement, last=last, flushed=again)


def _flushed(
    replay: Replay, cursor: Cursor, last: LastWrites, result: Any, failure: Exception | None
) -> Settlement | None:
    """Write ``last`` first, then decide: the flags that come back may say the
    run was cancelled. None when its step lost a first-write race: the pass
    runs again."""
    replay.write_back(cursor, last)
    try:
        replay.flush(cursor)
    except Suspend as rerun:
        unwound(rerun)
        return None
    except NonDeterminismError as exc:
        failure = exc
    return _decided(replay, result, failure)


def _decided(replay: Replay, result: Any, failure: Exception | None) -> Settlement:
    if isinstance(replay.unwinding, PauseRequested):
        return PAUSED
    if failure is not None:
        return _failed(replay, failure)
    return _returned(replay, result)


def limit_reached(replay: Replay, limit: str) -> Settlement:
    ceiling = replay.run.limits.get(limit, replay.run.limits.get("max_total_subagents"))
    error = f"Limit reached: {limit} (ceiling {ceiling}); resume with a higher limit to continue"
    return Settlement("error", "workflow_limit_reached", error, True, message=f"Run stopped: limit {limit} reached")


def _failed(replay: Replay, exc: Exception) -> Settlement:
    fatal = replay.fatal
    for candidate in (fatal, exc):
        if isinstance(candidate, WorkflowLimitReached):
            return limit_reached(replay, candidate.limit)
    if isinstance(fatal, NonDeterminismError) or isinstance(exc, NonDeterminismError):
        error = str(fatal or exc)
        return _nondeterminism(error)
    if isinstance(fatal, WorkflowCancelled) or isinstance(exc, WorkflowCancelled) or replay.cancelled():
        return CANCELLED
    if isinstance(exc, StorageCorruptError):
        return corrupt(exc)
    if isinstance(exc, StepFailed):
        error = f"StepFailed: step {exc.key!r} raised {exc.error_type}: {exc.error_message}"
    else:
        error = f"{type(exc).__name__}: {exc}"
    return Settlement("error", "exception", error, True, message=f"Run failed: {error}")


def _nondeterminism(error: str) -> Settlement:
    """The record keeps the error: a resume with new code clears the run's
    own, and the history still names both keys (``history.derive``)."""
    return Settlement("error", "nondeterminism", error, False, message=f"Run stopped: nondeterminism: {error}")


def _returned(replay: Replay, result: Any) -> Settlement:
    if isinstance(replay.fatal, WorkflowLimitReached):
        return limit_reached(replay, replay.fatal.limit)
    if isinstance(replay.fatal, NonDeterminismError):
        return _nondeterminism(str(replay.fatal))
    if replay.fatal is not None or replay.cancelled():
        return CANCELLED
    if result is None:
        return Settlement("completed", message="Run completed")
    try:
        encoded = jsonvalue.encode_payload(result, replay.max_payload_bytes, noun="Workflow result")
    except jsonvalue.PayloadError as exc:
        # The error is the SPEC's exact text; the run's system record says what in the result is not JSON.
        error = "Workflow result must be a JSON value" if exc.reason == "not_json" else str(exc)
        return Settlement("error", "invalid_result", error, True, message=f"Run failed: {exc}")
    return Settlement("completed", result_json=encoded, message="Run completed")


def branch_pass(replay: Replay, kept: KeptFanout | None = None) -> None:
    """Replay the main body up to the fan-out, where the target's thunks run;
    or run them from the thunks this process ``kept`` for the fan-out.

    A replay that fails or ends before it gets there is a divergence from the
    coordinator's history: every target branch gets a fatal outcome, which
    wakes the coordinator to stop the run.
    """
    target = replay.target
    assert target is not None
    try:
        if kept is not None:
            run_kept(replay, kept)
        else:
            cursor = replay.open_cursor(MAIN, writes=False)
            with replay.running(cursor):
                replay.workflow.run(WorkflowContext(replay))
    except BranchFinished as finished:
        unwound(finished)
        return
    except (StaleAttemptError, StorageUnavailableError):
        raise
    except Suspend:
        raise StaleAttemptError("branch replay reached an unfinished fan-out") from None
    except FATAL_ERRORS as exc:
        error: Exception = exc
    except Exception as exc:
        # Not necessarily a divergence: a volatile step before the fan-out
        # may have failed this time. An ordinary failure, retried on resume.
        failure = RuntimeError(
            f"Replaying the main body for fan-out {target.call} raised {type(exc).__name__}: {exc}"
        )
        _complete_all(replay, schema.failure_outcome(replay.epoch, failure))
        return
    else:
        error = NonDeterminismError(
            f"Replaying the main body for fan-out {target.call} returned before reaching it; "
            "check that your workflow is deterministic"
        )
    _complete_all(replay, schema.failure_outcome(replay.epoch, error, fatal=True))


def _complete_all(replay: Replay, outcome: schema.Outcome) -> None:
    """Every branch of the target ends with ``outcome``: its replay never reached them."""
    target = replay.target
    assert target is not None
    completions = Completions(replay.journal, target.call, target.route)
    for index in target.indices:
        completions.alone(index, outcome)
