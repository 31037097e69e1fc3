"""A workflow that calls a team's existing Celery tasks (``ctx.call``).

The engine is mounted on the team's own app (``examples/fleet_tasks.py``):
its durable tasks and queues are added, nothing else of the app changes.
Each ``ctx.call`` runs ``fleet.thumbnail`` on the ``gpu`` queue, served by
a plain ``celery worker`` that knows nothing of celery-durable, as a
journaled step: a call that returned is never sent again, and no durable
worker's slot is held while the GPU works. The calls fan out::

    celery -A examples.fleet_tasks worker -Q gpu -c 2 --hostname gpu@%h      # the team's worker, as it was
    celery-durable worker --app examples.render:engine --hostname durable@%h  # the durable queues
    celery-durable run render-gallery --app examples.render:engine --args '{"urls": ["https://example.com/a.png"]}'
"""

from __future__ import annotations

from typing import Any

from celery_durable import Engine, StepFailed, WorkflowContext, workflow
from examples.fleet_tasks import app, thumbnail


@workflow(
    name="render-gallery",
    description="Makes a thumbnail of every image on the GPU workers, then an index",
    phases=[{"title": "Render", "detail": "fleet.thumbnail on the gpu queue"}, {"title": "Index"}],
)
def render_gallery(ctx: WorkflowContext) -> dict[str, Any]:
    urls = list(ctx.args.get("urls") or [])
    timeout = float(ctx.args.get("timeout", 300))
    ctx.phase("Render")

    def render(index: int, url: str) -> Any:
        try:
            return ctx.call(f"thumb-{index}", thumbnail, args=(url,), kwargs={"size": 256}, timeout=timeout)
        except StepFailed as exc:
            ctx.log(f"{url}: {exc.error_type}: {exc.error_message}")
            return None

    thumbs = ctx.parallel([lambda i=i, url=url: render(i, url) for i, url in enumerate(urls)])
    ctx.phase("Index")
    made = [t for t in thumbs if t is not None]
    return {"images": len(urls), "thumbnails": [t["thumbnail"] for t in made], "failed": len(urls) - len(made)}


engine = Engine(workflows=[render_gallery], celery_app=app)
