"""RabbitMQ as the broker, the journal on Redis (SPEC §10).

The representative tests of the lifecycle, fan-out, agent and crash modules
run here again, imported, with one difference: ``settings`` names a RabbitMQ
(``rabbitmq_url``, tests/support/topologies.py) as the broker. Each test keeps its own
queue names and deletes its queues when it ends, since durable queues outlive
their consumers.

What RabbitMQ does differently is what these tests are for: it gives a dead
worker's unacknowledged messages back at once (Redis, after the visibility
timeout), so a SIGKILLed worker's branch or agent turn is delivered again while
liveness may be taking the run over; either way the run continues exactly
once. The broker's queue counts come from passive declares, to which RabbitMQ
answers a 404 by closing the channel.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable import WorkflowContext, workflow
from celery_durable.broker import schema
from celery_durable.tasks.queue_depths import BrokerQueues
from tests.conftest import DurableFactory, put_in_steps_queue

pytestmark = pytest.mark.topologies("rabbitmq")


# -- the broker's queue counts ----------------------------------------------------------


def test_queue_counts_survive_rabbitmqs_404_and_keep_one_connection(durable: DurableFactory) -> None:
    """The sweep asks twice a second whether the engine's queues are empty: a
    queue that does not exist yet counts as empty (RabbitMQ's 404 closes only
    the channel), a waiting message makes its queue busy, and every answer
    comes over the same connection (RabbitMQ pays for connection churn)."""
    d = durable([], worker=False)
    settings = d.settings
    queues = BrokerQueues(d.engine)
    try:
        assert queues() == [settings.coordinator_queue, settings.steps_queue, settings.agents_queue]
        connection = queues._connection
        put_in_steps_queue(settings)
        assert queues() == [settings.coordinator_queue, settings.agents_queue]
        assert queues._connection is connection
    finally:
        queues.close()


# -- a message delivered again ------------------------------------------------------------


@workflow(name="one-turn", description="A run whose agent turn the test starts by hand", phases=[])
def one_turn(ctx: WorkflowContext) -> Any:
    return None


AGENT = "a" * 32


def test_an_agent_message_delivered_again_leaves_its_running_turn_to_its_heartbeat(durable: DurableFactory) -> None:
    """RabbitMQ redelivers the message of a turn whose worker died while the
    turn's row still says running. Queuing it for later under a new id would
    drop the dead delivery's running entry, and the run would look alive for
    ever; it is left to its heartbeat, so a stale one makes the run dead and
    the take-over runs the turn again."""
    d = durable([one_turn], worker=False)
    store = d.engine.store
    run_id = d.client.start_workflow("one-turn")
    row = schema.queued_agent_row(AGENT, None, None, 1, 0)
    store.journal(run_id, 1, "default").agent_call("m", 0, AGENT, '{"prompt":"p"}', "m", row, None, "turn")

    def start(token: str) -> str:
        return store.agent_start(run_id, 1, AGENT, token, "later", 200).verdict

    def live() -> dict[str, str]:
        return dict(store.client.hgetall(store.run_keys(run_id).live))

    assert start("turn") == "go"
    running_entry = live()["turn"]
    assert start("turn") == "running"
    assert live()["turn"] == running_entry and "later" not in live()
    assert start("another-message") == "wait"  # a second message of the turn still waits its turn
    assert live()["turn"] == running_entry and live()["later"].startswith("q|a|")


# -- mounting on a team's app ----------------------------------------------------------


def test_mounting_keeps_the_apps_quorum_default_queue(settings: Any) -> None:
    """SPEC §5a: mounting changes nothing that affects the app's other tasks.
    An app whose default queue is a quorum queue (``task_default_queue_type``)
    kept it only until the engine was mounted: the mount rebuilt the default
    queue without its ``x-queue-type``, so the mounted app declared it classic,
    RabbitMQ refused the declare (PRECONDITION_FAILED) and the app's own tasks
    could no longer be sent."""
    from celery import Celery

    from celery_durable import Engine
    from tests.support.workflows import wf

    def app() -> Celery:
        made = Celery("team", broker=settings.effective_broker_url, set_as_current=False)
        made.conf.update(task_default_queue=f"{settings.key_prefix}.default", task_default_queue_type="quorum")

        @made.task(name="team.add", shared=False)
        def add(a: int, b: int) -> int:
            return a + b

        return made

    plain, mounted = app(), app()
    Engine([wf("noop", lambda ctx: 1)], settings, celery_app=mounted)
    assert mounted.amqp.queues[f"{settings.key_prefix}.default"].queue_arguments == {"x-queue-type": "quorum"}
    with plain.connection_for_write() as connection:
        plain.tasks["team.add"].apply_async((1, 2), connection=connection)  # the queue, declared as the team has it
        try:
            with mounted.connection_for_write() as again:
                mounted.tasks["team.add"].apply_async((2, 3), connection=again)
        finally:
            plain.amqp.queues[f"{settings.key_prefix}.default"].bind(connection.default_channel).delete()
