"""The journal of an archived run (issue 42), for a replay that only reads.

A run settled completed or cancelled has its journal hash folded into its
archive (``schema/archive.py``): no attempt writes it again, and the one
replay that still reads it is the replay check of a run named to it
(``Client.check_replay``). ``ArchivedJournal`` answers that replay's reads
(``dry_replay.READS``) from the archive as the read scripts answer them from
the hash (``schema.archive.sequence_reply``, parsed by the same reply
parsers); anything else is the settled run's fence: ``StaleAttemptError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from celery_durable.broker import schema
from celery_durable.broker.connection import Clock
from celery_durable.broker.journal import JOURNAL_CALLS, READ_ENTRIES_BUDGET, JournalIdentity
from celery_durable.broker.replies import journal as parse
from celery_durable.broker.schema import SequenceHistory
from celery_durable.broker.schema.archive import sequence_reply
from celery_durable.errors import StaleAttemptError


class ArchivedJournal(JournalIdentity):
    """The reads of ``Journal`` on an archived run's journal fields."""

    def __init__(self, fields: Mapping[str, str], *, run_id: str, epoch: int, clock: Clock) -> None:
        super().__init__(run_id, epoch, clock)
        self._fields = fields

    def read_sequence(self, seq: str, start: int = 0) -> SequenceHistory:
        return parse.read_sequence(sequence_reply(self._fields, seq, start), self._run_id, seq, start)

    def read_sequences(self, seqs: Sequence[str]) -> list[SequenceHistory]:
        """As read_sequences.lua: whole sequences, stopping after the one that spends the budget."""
        replies: list[Any] = []
        budget = READ_ENTRIES_BUDGET
        for seq in seqs:
            reply = sequence_reply(self._fields, seq)
            replies.append(reply)
            budget -= (len(reply) - 2) // 2
            if budget <= 0:
                break
        return parse.read_sequences(replies, self._run_id, seqs)

    def branch_outcomes(self, call: str, count: int, only: Sequence[int] | None = None) -> list[str | None]:
        indices = range(count) if only is None else only
        return [self._fields.get(schema.branch_field(call, j)) for j in indices]

    def handed_off(self, call: str, giver: str) -> list[int]:
        return schema.parse_handoff(self._fields.get(schema.handoff_field(call, giver)), self._epoch)

    def __getattr__(self, name: str) -> Any:
        """Every other method of ``Journal`` (its writes): refused, as the fence
        refuses a settled run's; any other name is no attribute, as on the store's."""
        if name not in JOURNAL_CALLS:
            raise AttributeError(name)

        def settled(*_args: Any, **_kwargs: Any) -> Any:
            raise StaleAttemptError(f"Run {self._run_id} is archived: its journal takes no {name}")

        return settled
