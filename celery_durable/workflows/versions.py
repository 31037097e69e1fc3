"""Which code a run runs: the code hash it started with and the one it runs now.

Runs outlive deploys, and automatic recovery and wakes replay a run with
whatever code the worker has (SPEC §8a: ``ctx.patched`` makes that safe). So
a pass notes the hash of its code when it differs from the one the run last
ran (``note_code``), which the run's detail shows and which resume compares
with after a divergence (SPEC §8); a pass whose code is the run's pays
nothing for it. When a replay diverges after such a change, its message
says so, naming both hashes, rather than only suspecting nondeterminism.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from celery_durable.broker.schema.profiles import ServedPhase, ServedWorkflow, encode_profile
from celery_durable.broker.schema.run import RunRecord

if TYPE_CHECKING:
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
