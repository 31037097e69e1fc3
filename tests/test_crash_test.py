"""``celery_durable.testing.crash_test``: users crash-test their own workflows.

The README's example is run as written (its asserts are the claim: the
charge without a key is flagged, with ``ctx.idempotency_key`` it is not);
the rest pins what the report says and what it does to the fakes, on the
explorer's real environment (a private redis-server, the real sweep).
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from celery_durable import WorkflowContext, workflow
from celery_durable.testing import CrashReport, Fake, crash_test
from tests.support.readme import in_section
from tests.test_pytest_plugin import _run


def readme_crash_test_block() -> str:
    (block,) = [b for b in in_section("Testing your workflows", "python") if "crash_test(" in b.code]
    return block.code


def test_the_readme_example_flags_the_charge_without_a_key_and_not_the_one_with() -> None:
    namespace: dict[str, Any] = {"__name__": "readme", "workflow": workflow}
    exec(compile(readme_crash_test_block(), "README.md", "exec"), namespace)  # its asserts are the claim
    assert namespace["report"].flagged == []
    assert namespace["payments"].charges == {}, "the fake is left as the test found it"


class Mailer(Fake):
    def __init__(self) -> None:
        self.sent: list[str] = []

    def send(self, to: str, text: str) -> dict[str, str]:
        self.side_effect(f"mail {to}")
        self.sent.append(to)
        return {"to": to}


mailer = Mailer()


@workflow(name="ct-approval", description="Asks, waits for a decision, tells the requester", phases=[])
def approval(ctx: WorkflowContext) -> Any:
    ctx.step("ask", lambda: mailer.send("boss", "approve?"))
    decision = ctx.wait_for_signal("decision")
    ctx.step("tally", lambda: {"ok": bool(decision.payload)})
    return ctx.step("tell", lambda: mailer.send("ada", f"decided: {decision.payload}"))


def test_a_signal_is_sent_as_the_run_waits_and_its_call_is_a_crash_point_too() -> None:
    mailer.sent.append("before the test")
    report = crash_test([approval], approval, fakes=[mailer], signals={"decision": True})
    assert isinstance(report, CrashReport) and report.workflow == "ct-approval"
    assert any("(in client signal decision)" in p.point for p in report.points)
    assert report.all_settled_as_clean, report.failures()
    assert report.reran == ["ask", "tally", "tell"]
    # Both mails went twice at some point; the tally has no side effect to repeat.
    assert report.flagged == ["ask", "tell"]
    assert {tuple(p.repeated) for p in report.points if p.repeated} == {("ask: mail boss",), ("tell: mail ada",)}
    assert mailer.sent == ["before the test"], "the fake's state is put back after the test"
    mailer.sent.clear()


def test_without_fakes_every_step_that_ran_twice_is_flagged() -> None:
    report = crash_test([approval], "ct-approval", signals={"decision": False})
    assert report.flagged == report.reran == ["ask", "tally", "tell"]
    text = str(report)
    assert text.startswith(f"ct-approval: {len(report.points)} crash points, {len(report.points)} settled")
    assert "need an idempotency key: ask, tally, tell" in text


def test_a_run_that_never_gets_its_signal_fails_its_clean_run() -> None:
    with pytest.raises(AssertionError, match="the clean run did not settle"):
        crash_test([approval], approval)


def test_the_plugin_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        flows=textwrap.dedent(
            """
            from celery_durable import workflow
            from celery_durable.testing import Fake

            class Shipper(Fake):
                def ship(self, order):
                    self.side_effect(f"ship {order}")
                    return {"shipped": order}

            shipper = Shipper()

            @workflow(name="ship-it", description="Ships an order", phases=[])
            def ship_it(ctx):
                return ctx.step("ship", lambda: shipper.ship(ctx.args["order"]))
            """
        )
    )
    pytester.makeconftest(
        "import pytest\nfrom flows import ship_it\n\n@pytest.fixture\ndef durable_workflows():\n    return [ship_it]\n"
    )
    pytester.makepyfile(
        test_user=textwrap.dedent(
            """
            from flows import ship_it, shipper

            def test_shipping_twice_is_found(durable_crash_test):
                report = durable_crash_test(ship_it, {"order": "A-1"}, fakes=[shipper])
                assert report.flagged == ["ship"]
                assert len(report.points) >= 6
            """
        )
    )
    _run(pytester).assert_outcomes(passed=1)
