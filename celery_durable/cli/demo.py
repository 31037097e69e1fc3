"""``celery-durable demo``: a trip booking, its workers killed mid-booking, finishing by itself.

The command only parses options and reports errors; ``celery_durable.demo``
does the work.
"""

from __future__ import annotations

from typing import Annotated

import typer

from celery_durable.cli.common import EXIT_FAILED, app, err, out


@app.command()
def demo(
    destination: Annotated[str, typer.Option("--destination", help="Where the trip goes.")] = "Seattle",
    workers: Annotated[int, typer.Option("--workers", min=1, max=8, help="Worker processes per generation.")] = 2,
    lease: Annotated[
        float, typer.Option("--lease", min=1, max=30, help="Seconds before a dead attempt's run is taken over.")
    ] = 3.0,
    timeout: Annotated[float, typer.Option("--timeout", min=5, help="Seconds to wait for each stage.")] = 60.0,
    private_redis: Annotated[
        bool,
        typer.Option("--private-redis", help="Start a private redis-server even if one is configured or running."),
    ] = False,
) -> None:
    """Book a trip, kill every worker with SIGKILL mid-booking, watch the run finish by itself.

    Real worker processes, a real Redis (the configured one, else localhost:6379,
    else a private redis-server), fake providers that honour idempotency keys.
    """
    # Imported here, not at the top: importing the demo's workflow module builds
    # its engine from the environment, which must not happen before the
    # command has chosen its Redis.
    from celery_durable.demo.script import LOG_DIR, DemoOptions, run_demo

    options = DemoOptions(
        destination=destination, workers=workers, lease_seconds=lease, timeout=timeout, private_redis=private_redis
    )
    try:
        result = run_demo(out, options)
    except (RuntimeError, TimeoutError) as exc:  # EmbeddedRedisError, a worker that would not start
        err.print(f"error: {exc} (worker logs: {LOG_DIR}/)", markup=False)
        raise typer.Exit(EXIT_FAILED) from None
    if not result.ok:
        raise typer.Exit(EXIT_FAILED)
