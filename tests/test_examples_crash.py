"""Every workflow in ``examples/`` crash-tested (``durable_crash_test``): killed
at each point a worker can die, recovered by the real sweep, compared with
its clean run. docs/testing.md has the table this pins.

The examples' stand-ins for outside services (a mailer, a payment provider,
a warehouse, the trip's booking providers) are wrapped in ``Service``, a
``Fake`` that behaves as a real service should: a call under an idempotency
key it has seen makes no new side effect. So a flagged step is one whose
side effect really happens twice when a worker dies at the wrong moment;
reads (orders, files, fraud scores) and the examples' agent turns (rules,
no model) have none to repeat.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from celery_durable import FunctionRunner, Workflow
from celery_durable.demo import providers
from celery_durable.testing import CrashReport, Fake
from celery_durable.testing.server import environment_redis_url
from examples import (
    approval,
    code_review,
    fleet_tasks,
    fulfilment,
    nightly,
    pipeline,
    rate_limited_agents,
    render,
    trip,
)


class Service(Fake):
    """A stand-in function as a service that honours idempotency keys."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function
        self.keys: set[str] = set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = inspect.signature(self.function).bind(*args, **kwargs).arguments.get("idempotency_key")
        if key is None or key not in self.keys:
            self.side_effect(self.function.__name__)
        if key is not None:
            self.keys.add(key)
        return self.function(*args, **kwargs)


@dataclass(frozen=True)
class Case:
    workflow: Workflow
    args: Any
    services: tuple[tuple[Any, str], ...]
    """(module, function name): the stand-ins with side effects."""
    reran: list[str]
    flagged: list[str]
    children: tuple[Workflow, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)


STAGES, DOCUMENTS = ("fetch", "tokenize", "count", "summarize"), ("fencing", "seed", "spec", "steps")
PIPELINE_STEPS = sorted([f"{stage}:{doc}" for stage in STAGES for doc in DOCUMENTS] + ["report"])
CASES = [
    Case(trip.trip, {"destination": "Oslo"}, ((providers, "book"), (providers, "cancel")),
         reran=["book-car", "book-flight", "book-hotel", "confirm-trip", "review"], flagged=[]),
    Case(approval.expense_approval, {"employee": "ada", "amount": 120}, ((approval, "notify"), (approval, "pay")),
         reran=["ask", "pay", "record-claim"], flagged=["ask"],
         options={"signals": {"approval": {"approved": True, "note": "ok"}}}),
    Case(fulfilment.fulfilment, {"order": "A-1", "amount": 30}, ((fulfilment, "reserve"), (fulfilment, "charge")),
         reran=["charge", "fraud-check", "reserve"], flagged=["reserve"],
         options={"signals": {"approval": {"approved": True}}}),
    Case(nightly.nightly_report, {"customers": ["acme", "globex", "empty-co"]}, (),
         reran=["orders", "summary"], flagged=[], children=(nightly.customer_report,)),
    Case(pipeline.pipeline, {"delay": 0}, (), reran=PIPELINE_STEPS, flagged=[]),
    Case(code_review.code_review, None, (),
         reran=["agent reviewer", "read:cart.js", "read:discount.js", "summary"], flagged=[],
         options={"agent_runner": FunctionRunner(routes={"reviewer": code_review.rule_reviewer})}),
    Case(rate_limited_agents.summarize_tickets, None, (), reran=["agent summarizer"], flagged=[],
         options={"agent_runner": FunctionRunner(default=rate_limited_agents.summarize)}),
    Case(render.render_gallery, {"urls": ["https://example.com/a.png", "https://example.com/b.png"]}, (),
         reran=[], flagged=[], options={"tasks": {"fleet.thumbnail": fleet_tasks.thumbnail}}),
]


@pytest.fixture(params=CASES, ids=[case.workflow.name for case in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def durable_workflows(case: Case) -> list[Workflow]:
    return [case.workflow, *case.children]


@pytest.fixture
def durable_env_options(case: Case) -> dict[str, Any]:
    return {name: value for name, value in case.options.items() if name != "signals"}


def test_every_crash_point_settles_as_the_clean_run(
    case: Case, durable_crash_test: Callable[..., CrashReport], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The trip's providers keep their bookings in Redis: the environment's own server.
    monkeypatch.setenv("CELERY_DURABLE_REDIS_URL", environment_redis_url())
    providers.default.cache_clear()
    fakes = []  # none: the steps call no service with side effects
    for module, name in case.services:
        fake = Service(getattr(module, name))
        monkeypatch.setattr(module, name, fake)
        fakes.append(fake)
    report = durable_crash_test(case.workflow, case.args, fakes=fakes, signals=case.options.get("signals"))
    print(f"\n{report}")
    providers.default.cache_clear()
    assert report.points and report.all_settled_as_clean, report.failures()
    assert (report.reran, report.flagged) == (case.reran, case.flagged)
