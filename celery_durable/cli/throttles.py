"""``celery-durable throttles list|show|set|delete``: each one call on the public client."""

from __future__ import annotations

from typing import Annotated

import typer

from celery_durable import ThrottleInfo
from celery_durable.cli.common import (
    AppOption,
    JsonOption,
    NamespaceOption,
    UserError,
    app,
    client_for,
    emit,
    guarded,
    out,
    print_json,
)
from celery_durable.throttles import rate_of

throttles_app = typer.Typer(no_args_is_help=True, help="Fleet-wide concurrency and rate limits.")
app.add_typer(throttles_app, name="throttles")

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="The throttle's name.")]
RATE_HELP = "N/SECONDS: at most N slots taken in any window of SECONDS (e.g. 500/60)."


def parse_rate(option: str, text: str | None) -> tuple[int, float] | None:
    """``N/SECONDS`` as ``(n, period_seconds)``; the client checks the numbers."""
    if text is None:
        return None
    try:
        return rate_of(text)
    except ValueError:
        raise UserError(f"{option} takes N/SECONDS (e.g. 500/60), got {text!r}") from None


def _rate_text(rate: tuple[int, float] | None) -> str:
    return "-" if rate is None else f"{rate[0]}/{rate[1]:g}s"


def _line(info: ThrottleInfo) -> str:
    return (
        f"{info.name}  concurrency={info.concurrency or '-'}  rate={_rate_text(info.rate)}  "
        f"per_key_concurrency={info.per_key_concurrency or '-'}  per_key_rate={_rate_text(info.per_key_rate)}  "
        f"holding={info.holding}  waiting={info.waiting}"
    )


@throttles_app.command("list")
def throttles_list(app_path: AppOption, namespace: NamespaceOption = None, as_json: JsonOption = False) -> None:
    """The namespace's throttles: settings, slots held, waiters."""
    found = guarded(lambda: client_for(app_path, namespace).list_throttles())
    if as_json:
        print_json([info.to_dict() for info in found])
        return
    if not found:
        out.print("no throttles", markup=False)
    for info in found:
        out.print(_line(info), markup=False)


@throttles_app.command("show")
def throttles_show(
    name: NameArgument, app_path: AppOption, namespace: NamespaceOption = None, as_json: JsonOption = False
) -> None:
    """One throttle: its settings, its holders, its waiters in the order they get slots, its top keys."""
    info = guarded(lambda: client_for(app_path, namespace).get_throttle(name))
    if as_json:
        print_json(info.to_dict())
        return
    out.print(_line(info), markup=False)
    for title, rows in (("holders", info.holders), ("waiters", info.waiters)):
        out.print(f"{title}:", markup=False)
        for h in rows:
            key = f"  key={h.key}" if h.key else ""
            out.print(f"  {h.run_id}  {h.op}  attempt {h.attempt}{key}  since {h.since.isoformat()}", markup=False)
    if info.top_keys:
        out.print("top keys: " + ", ".join(f"{k}={n}" for k, n in info.top_keys), markup=False)


@throttles_app.command("set")
def throttles_set(
    name: NameArgument,
    app_path: AppOption,
    concurrency: Annotated[int | None, typer.Option("--concurrency", help="Slots held at once, fleet-wide.")] = None,
    rate: Annotated[str | None, typer.Option("--rate", help=RATE_HELP)] = None,
    per_key_concurrency: Annotated[
        int | None, typer.Option("--per-key-concurrency", help="Slots held at once per throttle key.")
    ] = None,
    per_key_rate: Annotated[str | None, typer.Option("--per-key-rate", help="As --rate, per throttle key.")] = None,
    namespace: NamespaceOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create or replace a throttle; it applies at once to what waits."""

    def body() -> ThrottleInfo:
        return client_for(app_path, namespace).set_throttle(
            name,
            concurrency=concurrency,
            rate=parse_rate("--rate", rate),
            per_key_concurrency=per_key_concurrency,
            per_key_rate=parse_rate("--per-key-rate", per_key_rate),
        )

    info = guarded(body)
    emit(as_json, info.to_dict(), _line(info))


@throttles_app.command("delete")
def throttles_delete(
    name: NameArgument, app_path: AppOption, namespace: NamespaceOption = None, as_json: JsonOption = False
) -> None:
    """Delete a throttle: whatever waits on it goes on unthrottled."""
    guarded(lambda: client_for(app_path, namespace).delete_throttle(name))
    emit(as_json, {"deleted": name}, f"deleted {name}")
