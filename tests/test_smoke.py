from celery_durable import define_workflow


def test_a_step_runs_and_its_result_is_returned(durable) -> None:
    wf = define_workflow(
        {"name": "one", "description": "one step", "phases": []},
        lambda ctx: ctx.step("a", lambda: 41) + 1,
    )
    d = durable([wf])
    envelope = d.client.run_workflow("one", timeout=20)
    assert envelope.status == "completed"
    assert envelope.result == 42
