"""Fleets of several teams: a worker that does not know a run's workflow passes
its message on, and the run waits, alive, for one that does (issue 25 item 13).

Temporal never fails a workflow because a worker lacked its type: the task
waits for a worker that has it. Here the message goes back to its queue under
a new id (``requeue.lua``, ``tasks/messages.py``), the run says so once (a
``system`` progress record, one WARNING line), and never becomes ``error``.

Each team's worker is a process of its own (``tests/support/apps/teams.py``), as in a
deployment: Celery's worker looks a task up on the process's current app, so
two engines' workers in one process would run each other's tasks.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable import Client
from celery_durable.tasks import messages as unserved
from celery_durable.tasks.messages import RunMessage
from tests.conftest import DurableFactory
from tests.support.apps.teams import EVERY
from tests.support.fleet import Fleet
from tests.support.poll import poll

TIMEOUT = 30
QUICK = {"CELERY_DURABLE_UNSERVED_BACKOFF_SECONDS": "2"}
"""A worker that passes messages on backs off to 2 s, not 30: whether a
worker that knows the workflow finds them, not how long the backoff grows
(its own test), is what most tests here wait for."""
SERVED = 60
"""How long a run may take once a worker that knows it comes while one that
does not still takes its messages: each message that worker passes on waits
twice as long as the last, up to about 30 s (SPEC §3)."""
UNSERVED = "No worker that took its messages has workflow"
WARNED = "is not registered with this worker's engine"


def system_records(client: Client, run_id: str) -> list[str]:
    records = client.get_workflow_run_progress(run_id, limit=500).records
    return [record.message for record in records if record.kind == "system"]


def passed_on(client: Client, run_id: str, seen: set[str], kind: str) -> set[str]:
    """The run's queued messages of ``kind`` (c, s) seen so far: each pass-on queues a new one."""
    store = client.engine.store
    live: dict[str, Any] = store.client.hgetall(store.run_keys(run_id).live)
    seen.update(task for task, value in live.items() if value.startswith(f"q|{kind}|"))
    return seen


def warnings(fleet: Fleet) -> list[str]:
    return [line for path in fleet.log_dir.glob("*.log") for line in path.read_text().splitlines() if WARNED in line]


def test_a_run_no_worker_knows_waits_alive_and_goes_on_once_a_worker_that_knows_it_comes(
    durable: DurableFactory, fleet: Fleet
) -> None:
    client = durable(EVERY, worker=False).client
    run_id = client.start_workflow("ghost")
    fleet.start("tests.support.apps.teams:partial", name="partial", env=QUICK)  # knows only echo, and imports nothing
    seen: set[str] = set()
    poll(lambda: len(passed_on(client, run_id, seen, "c")) >= 4, within=TIMEOUT, what="3 messages passed on")
    envelope = client.get_workflow_run(run_id)
    assert (envelope.status, envelope.attempt) == ("pending", 1), "the run was failed or taken over"
    assert [m for m in system_records(client, run_id) if UNSERVED in m] == [
        f"{UNSERVED} 'ghost' registered; they wait for one that has"
    ]
    assert len(warnings(fleet)) == 1 and "'ghost'" in warnings(fleet)[0]
    fleet.start("tests.support.apps.teams:billing", name="billing")  # a worker that knows it
    done = client.wait_for_workflow_run(run_id, timeout=SERVED)
    assert (done.status, done.result, done.attempt) == ("completed", "boo", 1)


@pytest.mark.topologies("redis", "cluster")
def test_branches_that_reach_a_worker_that_does_not_know_the_workflow_wait_for_one_that_does(
    durable: DurableFactory, fleet: Fleet
) -> None:
    client = durable(EVERY, worker=False).client
    settings = client.engine.settings
    run_id = client.start_workflow("ghost-fan")
    # The coordinator that knows the workflow consumes only its queue; the
    # branches it sends (each its own task: none runs in its pass) land on the
    # steps queue, served only by `partial`.
    fleet.start(
        "tests.support.apps.teams:billing",
        name="coordinator",
        queues=[settings.coordinator_queue],
        env={"CELERY_DURABLE_BRANCH_BATCH_MS": "0"},
    )
    fleet.start("tests.support.apps.teams:partial", name="partial", queues=[settings.steps_queue], env=QUICK)
    seen: set[str] = set()
    poll(lambda: len(passed_on(client, run_id, seen, "s")) >= 3, within=TIMEOUT, what="branches passed on")
    envelope = client.get_workflow_run(run_id)
    assert (envelope.status, envelope.attempt) == ("running", 1)
    fleet.start("tests.support.apps.teams:billing", name="steps", queues=[settings.steps_queue])
    done = client.wait_for_workflow_run(run_id, timeout=SERVED)
    assert (done.status, done.result, done.attempt) == ("completed", [1, 2], 1)


def test_two_engines_with_default_queues_on_one_redis_both_work(durable: DurableFactory, fleet: Fleet) -> None:
    """Two teams' engines share a Redis and the queue names; each team's worker
    takes the other's messages too, and passes them on."""
    client = durable(EVERY, worker=False).client
    fleet.start("tests.support.apps.teams:billing", name="billing", env=QUICK)
    fleet.start("tests.support.apps.teams:shop", name="shop", env=QUICK)
    bills = [client.start_workflow("bill") for _ in range(4)]
    orders = [client.start_workflow("order", args={"n": n}) for n in range(4)]
    for run_id in bills + orders:
        envelope = client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
        assert (envelope.status, envelope.reason, envelope.attempt) == ("completed", None, 1)
    assert [client.get_workflow_run(r).result for r in orders] == [["reserved", n] for n in range(4)]
    assert client.get_workflow_run(bills[0]).result == ["charged", "mailed"]


def test_a_message_no_worker_serves_backs_off_doubling_up_to_about_30_seconds(durable: DurableFactory) -> None:
    """Each pass-on of the run's message waits twice as long as the one before,
    from half a second up to about 30 s (jittered by a fifth either way): the
    count travels with the run, whichever worker passes the message on. The
    live entry is due when the countdown says, so liveness judges it right."""
    client = durable(EVERY, worker=False).client
    engine, store = client.engine, client.engine.store
    run_id = client.start_workflow("ghost")
    live = store.run_keys(run_id).live
    [token] = store.client.hkeys(live)
    message = RunMessage(run_id, 1, "ghost")
    countdowns: list[float] = []
    sent: list[tuple[str, float]] = []
    for _ in range(10):
        before = store.now_ms()
        unserved.pass_on(engine, message, token, "c", lambda new, countdown: sent.append((new, countdown)))
        token, countdown = sent[-1]
        due = int(store.client.hget(live, token).split("|")[2])
        assert before + countdown * 1000 <= due <= store.now_ms() + countdown * 1000
        countdowns.append(countdown)
    for n, countdown in enumerate(countdowns):
        expected = min(0.5 * 2**n, 30.0)
        assert 0.8 * expected - 0.001 <= countdown <= 1.2 * expected + 0.001, (n, countdowns)
    assert countdowns[-1] >= 24 and max(countdowns) <= 36, countdowns
    assert [m for m in system_records(client, run_id) if UNSERVED in m] == [
        f"{UNSERVED} 'ghost' registered; they wait for one that has"
    ], "the note is written once"
    envelope = client.get_workflow_run(run_id)
    assert (envelope.status, envelope.attempt) == ("pending", 1)


def test_a_pending_run_no_worker_serves_is_cancelled_at_once_and_its_message_is_refused_later(
    durable: DurableFactory, fleet: Fleet
) -> None:
    """A run no attempt started is settled cancelled by the cancel itself,
    though the only worker passes its message on and none will ever serve it;
    the message still in flight is refused by the fence afterwards, quietly."""
    client = durable(EVERY, worker=False).client
    run_id = client.start_workflow("ghost")
    fleet.start("tests.support.apps.teams:partial", name="partial")
    seen: set[str] = set()
    poll(lambda: len(passed_on(client, run_id, seen, "c")) >= 2, within=TIMEOUT, what="a message passed on")
    envelope = client.cancel_workflow_run(run_id, timeout=5)
    assert (envelope.status, envelope.reason, envelope.error) == ("cancelled", "cancelled", "Cancelled while pending")
    assert envelope.attempt == 1, "no attempt ran: the epoch is bumped for fencing only"
    assert system_records(client, run_id)[-1] == "Run cancelled"
    store = client.engine.store
    assert store.client.hgetall(store.run_keys(run_id).live) == {}, "nothing of it is in flight"
    # The message the worker holds comes due and is refused as stale: no error, no new message.
    poll(lambda: _refused(fleet), within=TIMEOUT, what="the held message refused")
    assert client.get_workflow_run(run_id).status == "cancelled"
    assert not any("Traceback" in path.read_text() for path in fleet.log_dir.glob("*.log"))


def _refused(fleet: Fleet) -> bool:
    return any("refused stale or forged" in path.read_text() for path in fleet.log_dir.glob("*.log"))
