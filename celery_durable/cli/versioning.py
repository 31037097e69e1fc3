"""``celery-durable replay-check`` and ``runs export``: deploying code under
running runs (docs/versioning.md)."""

from __future__ import annotations

from typing import Annotated

import typer

from celery_durable.cli.common import (
    EXIT_FAILED,
    AppOption,
    JsonOption,
    NamespaceOption,
    RunArgument,
    app,
    client_for,
    guarded,
    on_client,
    out,
    print_json,
    runs_app,
)
from celery_durable.client.versioning import ReplayCheck


@app.command("replay-check")
def replay_check(
    app_path: AppOption,
    workflow_name: Annotated[str | None, typer.Option("--workflow", help="Only runs of this workflow.")] = None,
    run_ids: Annotated[
        list[str] | None,
        typer.Option("--run", metavar="RUN_ID", help="Check this run, whatever its status (repeat for several)."),
    ] = None,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Replay runs against the code --app registers, running and writing nothing.

    By default every run that can still continue (pending, running, paused,
    halted, and error that can resume). One line per run, then the summary;
    exits 1 when a run diverges or fails: run it in the deploy pipeline
    before workers with the new code start.
    """
    checks = guarded(
        lambda: client_for(app_path, namespace).check_replay(run_ids or None, workflow=workflow_name)
    )
    counts = {verdict: sum(1 for check in checks if check.verdict == verdict) for verdict in ("ok", "diverges")}
    failed = len(checks) - counts["ok"] - counts["diverges"]  # unknown_workflow counts as failed
    # The summary's wording is the contract's, to the letter ("1 runs checked"
    # too): deploy pipelines match it.
    summary = f"{len(checks)} runs checked: {counts['ok']} ok, {counts['diverges']} diverge, {failed} failed"
    if as_json:
        print_json(
            {
                "runs": [check.to_dict() for check in checks],
                "checked": len(checks),
                "ok": counts["ok"],
                "diverge": counts["diverges"],
                "failed": failed,
            }
        )
    else:
        for check in checks:
            out.print(_line(check), markup=False, soft_wrap=True)
        out.print(summary, markup=False)
    if len(checks) != counts["ok"]:
        raise typer.Exit(EXIT_FAILED)


def _line(check: ReplayCheck) -> str:
    line = f"{check.run_id}  {check.workflow}  {check.status}  {check.verdict}"
    return f"{line}  {check.message}" if check.message else line


@runs_app.command("export")
def runs_export(
    run_id: RunArgument, app_path: AppOption, namespace: NamespaceOption = None, as_json: JsonOption = False
) -> None:
    """Print a run's history (the run and its journal) as JSON, for
    celery_durable.testing.replay_history (--json changes nothing: it is JSON either way)."""
    print_json(on_client(app_path, namespace, lambda client: client.export_history(run_id)))
