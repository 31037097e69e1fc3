from celery_durable import WorkflowContext, define_workflow, ChildWorkflowFailed

def leaf(ctx: WorkflowContext):
    return ctx.step("double", lambda: ctx.args["n"] * 2)

def parent(ctx: WorkflowContext):
    a = ctx.child("one", "leaf", {"n": 1})
    b = ctx.parallel([lambda i=i: ctx.child(f"p{i}", "leaf", {"n": i}) for i in range(5)])
    return {"a": a, "b": b}

LEAF = define_workflow({"name": "leaf", "description": "d", "phases": []}, leaf)
PARENT = define_workflow({"name": "parent", "description": "d", "phases": []}, parent)

def test_smoke(durable):
    d = durable([LEAF, PARENT])
    env = d.client.run_workflow("parent", timeout=60)
    assert env.status == "completed", env
    assert env.result == {"a": 2, "b": [0, 2, 4, 6, 8]}
    detail = d.client.get_workflow_run_detail(env.run_id)
    assert len(detail.children) == 6
    assert all(c.status == "completed" for c in detail.children)
    child = d.client.get_workflow_run(detail.children[0].run_id)
    assert child.parent_run_id == env.run_id
