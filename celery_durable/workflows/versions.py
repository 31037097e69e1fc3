"""Code that changes under running runs: which code a run runs (the code hash
it started with and the one it runs now), and ``ctx.patched`` and
``ctx.deprecate_patch``, which let old runs keep their path (SPEC §8, §8a).

Runs outlive deploys, and automatic recovery and wakes replay a run with
whatever code the worker has (SPEC §8a: ``ctx.patched`` makes that safe). So
a pass notes the hash of its code when it differs from the one the run last
ran (``note_code``), which the run's detail shows and which resume compares
with after a divergence (SPEC §8); a pass whose code is the run's pays
nothing for it. When a replay diverges after such a change, its message
says so, naming both hashes, rather than only suspecting nondeterminism.

A run replays its journal with whatever code the worker has, and runs wait
for days across deploys. A change that adds, moves or removes calls before
the point a waiting run has reached would make its replay diverge; a patch
(``ctx.patched``) lets the old run keep its path while new work takes the
new one.

A patch marker is an op of its sequence, with an identity of its own
(``Identity.patch``), so it takes part in the order check: a run that took
the new branch can never replay into the old one. ``patched(id)`` decides by
what the journal holds where it is asked:

- inside the journaled part of the sequence, the marker there is consumed
  (True); any other op there (a pending wait counts: it is journaled) means
  the run went past this point under the old code (False, nothing journaled);
- past the journal's end it is new work: a marker is journaled, True.

Answers are per sequence, as the order check is: the main body and each
branch decide on their own, so a branch that starts after a deploy takes the
new path even in an old run. Within a sequence the first answer for an id
holds (``Cursor.patches``), whichever of the two calls asked.
``deprecate_patch(id)`` is for when no run still needs the old path: it
consumes the marker where one is journaled and does nothing where none is,
so code that dropped the old branch still replays runs that took the new one.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from celery_durable.broker.journal import PendingCommit
from celery_durable.broker.schema import Identity
from celery_durable.broker.schema.profiles import ServedPhase, ServedWorkflow, encode_profile
from celery_durable.broker.schema.run import RunRecord

if TYPE_CHECKING:
    from celery_durable.workflows.cursor import Cursor
    from celery_durable.workflows.definition import Workflow
    from celery_durable.workflows.replay import Replay

DETERMINISM_HINT = (
    "Check that your workflow is deterministic: move clocks, randomness and I/O into steps, "
    "or use ctx.now() and ctx.uuid4()"
)


def note_code(replay: Replay) -> None:
    """At a coordinator pass's start: record this code's hash on the run when
    it is not the one the run last ran (one fenced write, after a deploy)."""
    registered = replay.workflow.code_hash
    if registered != last_code_hash(replay.run):
        replay.journal.note_code(registered)


def last_code_hash(record: RunRecord) -> str:
    """The hash of the code the run's latest pass ran (the code that diverged,
    for a run stopped on nondeterminism)."""
    return record.attempt_code_hash or record.code_hash


def divergence_message(workflow: Workflow, record: RunRecord, where: str, call: int, detail: str) -> str:
    """The error of a run whose replay asked for another call than its journal holds."""
    head = f"Workflow {workflow.name!r} replayed differently in {where} at call {call}: {detail}. "
    started = record.code_hash
    if started and started != workflow.code_hash:
        return head + (
            f"The workflow's code changed since the run started (code hash {started} then, "
            f"{workflow.code_hash} now): guard a change of the calls before the point running runs have "
            "reached with ctx.patched(), or resume the run with the code it started with (docs/versioning.md)"
        )
    return head + DETERMINISM_HINT


def profile_of(workflows: Mapping[str, Workflow], queues: Collection[str]) -> str:
    """What a worker registering ``workflows`` and consuming ``queues`` publishes
    with its beat: the code it serves, which clients compare to find a mixed deploy."""
    served = [
        ServedWorkflow(
            name,
            wf.code_hash,
            wf.description,
            tuple(ServedPhase(p.phase_id, p.title, p.detail) for p in wf.phases),
            wf.version,
        )
        for name, wf in sorted(workflows.items())
    ]
    return encode_profile(sorted(queues), served)


# -- ctx.patched ---------------------------------------------------------------

PATCH_ID_MAX = 128
PATCH_ID_PATTERN = re.compile(rf"[A-Za-z0-9._:-]{{1,{PATCH_ID_MAX}}}")


def check_patch_id(patch_id: object) -> str:
    if not isinstance(patch_id, str) or not PATCH_ID_PATTERN.fullmatch(patch_id):
        raise ValueError(
            f"A patch id must be a non-blank string of at most {PATCH_ID_MAX} characters of "
            f"[A-Za-z0-9._:-], got {patch_id!r:.80}"
        )
    return patch_id


def patched(replay: Replay, patch_id: str) -> bool:
    """True where the run executes new code at this point, False where it had
    gone past it under the old code."""
    check_patch_id(patch_id)
    cursor = replay.current()
    replay.check_cancelled()
    answers = _answers(cursor)
    if patch_id in answers:
        return answers[patch_id]
    identity = Identity.patch(patch_id)
    journaled = cursor.journaled()
    if journaled is not None:
        answer = journaled[0] == identity
        if answer:
            cursor.advance()
    else:
        # New work. An execution that only replays (a branch task on its way
        # to its fan-out, a replay check) stops here as at any other new op.
        replay.expect(cursor, identity)
        _journal_marker(replay, cursor, PendingCommit(cursor.index, identity))
        answer = True
    answers[patch_id] = answer
    return answer


def deprecate_patch(replay: Replay, patch_id: str) -> None:
    """Consume the marker of ``patch_id`` where one is journaled here; nothing
    where none is. The id then counts as patched in this sequence."""
    check_patch_id(patch_id)
    cursor = replay.current()
    replay.check_cancelled()
    answers = _answers(cursor)
    if patch_id in answers:
        return
    journaled = cursor.journaled()
    if journaled is not None and journaled[0] == Identity.patch(patch_id):
        cursor.advance()
    answers[patch_id] = True


def _answers(cursor: Cursor) -> dict[str, bool]:
    if cursor.patches is None:
        cursor.patches = {}
    return cursor.patches


def _journal_marker(replay: Replay, cursor: Cursor, marker: PendingCommit) -> None:
    """Journal a marker as a step's write is journaled: held back to travel
    with the sequence's next write where steps are (one at a time: a step
    held before it goes first), else at once."""
    if replay.holds_steps(cursor):
        if cursor.held is not None:
            replay.flush(cursor)
        replay.hold(cursor, marker)
        cursor.advance()
        return
    replay.commit(cursor, marker)
