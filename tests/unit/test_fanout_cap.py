"""The fan-out cap (SPEC §4: at most ``settings.max_fanout`` thunks or items,
else ``ValueError`` before any of them runs), for thunks and items given as
an iterator: it is read one past the cap, never to its end."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from celery_durable import WorkflowContext, workflow
from celery_durable.testing import WorkflowTestEnvironment

CAP = 8
pulled: list[int] = []


def endless() -> Iterator[int]:
    """An iterator that never ends; one read far past the cap is a hang averted."""
    for index in itertools.count():
        assert index < 1000, "the fan-out read its iterator far past the cap"
        pulled.append(index)
        yield index


@workflow(name="endless-fanout", description="Fans out over an iterator that never ends", phases=[])
def endless_fanout(ctx: WorkflowContext) -> Any:
    if ctx.args["call"] == "parallel":
        return ctx.parallel(lambda: 1 for _ in endless())
    return ctx.pipeline(endless(), lambda previous, item, index: previous)


@pytest.mark.parametrize(("call", "noun"), [("parallel", "thunks"), ("pipeline", "items")])
def test_an_endless_iterator_is_refused_at_the_cap_not_read_to_its_end(call: str, noun: str) -> None:
    """It was drained with list() before the cap was checked: an endless
    generator hung the pass, its memory growing, and the run never settled."""
    pulled.clear()
    env = WorkflowTestEnvironment([endless_fanout], max_fanout=CAP)
    envelope = env.run(endless_fanout, args={"call": call})
    assert (envelope.status, envelope.reason) == ("error", "exception")
    assert envelope.error == (
        f"ValueError: {call} accepts at most {CAP} {noun} (settings.max_fanout), got more than {CAP}"
    )
    assert len(pulled) == CAP + 1


def test_a_list_over_the_cap_still_says_how_long_it_is() -> None:
    @workflow(name="long-list", description="Fans out over one thunk too many", phases=[])
    def long_list(ctx: WorkflowContext) -> Any:
        return ctx.parallel([lambda: 1] * (CAP + 5))

    envelope = WorkflowTestEnvironment([long_list], max_fanout=CAP).run(long_list)
    assert envelope.error == f"ValueError: parallel accepts at most {CAP} thunks (settings.max_fanout), got {CAP + 5}"
