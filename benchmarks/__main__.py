"""``python -m benchmarks [--quick] [--repeat N] [--output DIR] [--cases a,b]``.

Starts a private redis-server and the worker fleet, runs the cases, writes
RESULTS.md and results.json to the output directory (default: benchmarks/).
Exits 1 when a case failed to run (a missed target is a result, not a failure).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.cases import CASES
from benchmarks.harness import Bench, WorkerSetup, bench_session
from benchmarks.model import CaseResult
from benchmarks.plan import Plan, full_plan, quick_plan
from benchmarks.profiling import recording, summarize
from benchmarks.report import environment, load_json, write_json, write_markdown

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: the CI smoke test")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (the median is reported)")
    parser.add_argument("--output", type=Path, default=HERE, help="where RESULTS.md and results.json go")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=4, help="threads per worker")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="what-if: workers call gc.freeze() once ready (a fix NOTES.md recommends)")
    parser.add_argument("--fanout-tasks", type=int, default=None,
                        help="what-if: settings.fanout_tasks for the workers (default: the engine's)")
    parser.add_argument("--fanout-sizes", default=None, metavar="N,N,...",
                        help="fan-out widths instead of the plan's (the first is the reference and has a baseline)")
    parser.add_argument("--burst-sizes", default=None, metavar="N,N,...",
                        help="timers due at once in the timer-burst case instead of the plan's")
    parser.add_argument("--external-sweep", action="store_true",
                        help="what-if for the timers case: the workers run no recovery sweep; one RecoverySweep "
                        "thread in the benchmark process sweeps and fires the timers")
    parser.add_argument("--py-spy", type=Path, default=None, metavar="DIR",
                        help="record the worker with py-spy during each case into DIR/<case>.txt")
    parser.add_argument("--render", action="store_true",
                        help="only render RESULTS.md again from the output's results.json")
    parser.add_argument("--merge", action="store_true",
                        help="put the cases run into the output's existing results.json, replacing the same "
                        "cases (a rerun of noisy ones) and keeping the others")
    args = parser.parse_args(argv)
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        env, cases, seconds = load_json(args.output / "results.json")
        write_markdown(args.output / "RESULTS.md", env, cases, seconds)
        return 0
    plan = _plan(args)
    setup = WorkerSetup(workers=args.workers, pool="threads", concurrency=args.concurrency)
    output: Path = args.output
    output.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    load = {"start": [round(x, 2) for x in os.getloadavg()]}
    results: list[CaseResult] = []
    what_if: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    if plan.quick:
        os.environ["BENCH_NO_MINGLE"] = "1"  # every worker it starts skips Celery's mingle (benchmarks.app)
    if args.gc_freeze:
        os.environ["BENCH_GC_FREEZE"] = "1"
        what_if["gc_freeze"] = True
    if args.py_spy is not None:
        what_if["py_spy"] = "worker sampled by py-spy: its figures are slowed down by the sampling"
    if args.fanout_tasks is not None:
        overrides["fanout_tasks"] = what_if["fanout_tasks"] = args.fanout_tasks
    if args.external_sweep:
        plan = dataclasses.replace(plan, external_sweep=True)
        what_if["external_sweep"] = "timers fired by one sweep thread in the benchmark process, none in the workers"
    with bench_session(setup, max_fanout=plan.max_fanout, overrides=overrides) as bench:
        redis_version = str(bench.raw.info("server")["redis_version"])
        bench.start_workers()
        for key in _run_order(args.cases.split(","), plan.quick):
            case_started = time.perf_counter()
            case_load = round(os.getloadavg()[0], 2)
            print(f"[benchmarks] {key} ...", file=sys.stderr, flush=True)
            try:
                if not _owns_fleet(key):
                    bench.use_fleet()  # a case before it may have left another fleet running
                result = _run_case(key, bench, plan, args.py_spy)
            except Exception as exc:
                traceback.print_exc()
                result = CaseResult(key=key, title=key, setup="", error=f"{type(exc).__name__}: {exc}")
                if not any(worker.alive() for worker in bench.workers):
                    bench.start_workers()
            result.seconds = time.perf_counter() - case_started
            result.load = [case_load, round(os.getloadavg()[0], 2)]
            print(f"[benchmarks] {key} done in {result.seconds:.1f} s", file=sys.stderr, flush=True)
            results.append(result)
    order = args.cases.split(",")
    results.sort(key=lambda case: order.index(case.key))  # reported in the order asked for, whatever the run order
    load["end"] = [round(x, 2) for x in os.getloadavg()]
    seconds = time.perf_counter() - started
    env = environment(redis_version, setup, plan, load, what_if)
    if args.merge and (output / "results.json").exists():
        env, results, seconds = _merged(output / "results.json", env, results)
    write_json(output / "results.json", env, results, seconds)
    write_markdown(output / "RESULTS.md", env, results, seconds)
    for case in results:
        for row in case.rows:
            verdict = f"  [{row.verdict}]" if row.verdict else ""
            ratio = f"  ratio {row.ratio:.2f}" if row.ratio is not None else ""
            print(f"{row.case:14} {row.figure:55} {row.value:12.4g} {row.unit}{ratio}{verdict}")
    print(f"wrote {output / 'RESULTS.md'} and {output / 'results.json'} in {seconds:.0f} s")
    return 1 if any(case.error for case in results) else 0


def _owns_fleet(key: str) -> bool:
    return bool(getattr(sys.modules[CASES[key].__module__], "OWN_FLEET", False))


def _run_order(keys: list[str], quick: bool) -> list[str]:
    """The order the cases run in: as asked, but with ``--quick`` every case on the session's fleet first.

    Each case that starts a fleet of its own made the next one start the
    session's again: in the smoke run, four fleet starts of a few seconds
    each, as long as its cases together. Run after the others, the cases
    with their own fleets also share one when theirs match: timers, many
    and soak; bursts, run after schedules (which stops the fleet it finds
    for its in-process part, then starts the same 2 x -c 8 fleet bursts
    uses). Every case still asks for the fleet it needs, so the order
    changes no case; full runs keep the issue's order.
    """
    if not quick:
        return keys
    return sorted(keys, key=lambda key: (_owns_fleet(key), key in QUICK_LAST))  # stable: else the order


QUICK_LAST = frozenset({"bursts"})


def _plan(args: argparse.Namespace) -> Plan:
    """The plan's sizes, with the sizes the command line gave instead."""
    plan = quick_plan(args.repeat) if args.quick else full_plan(args.repeat)
    if args.fanout_sizes:
        widths = tuple(int(n) for n in args.fanout_sizes.split(","))
        baseline = tuple(n for n in widths if n in plan.fanout_baseline_sizes) or widths[:1]
        plan = dataclasses.replace(plan, fanout_sizes=widths, fanout_baseline_sizes=baseline)
    if args.burst_sizes:
        plan = dataclasses.replace(plan, burst_sizes=tuple(int(n) for n in args.burst_sizes.split(",")))
    return plan


def _merged(
    path: Path, env: dict[str, Any], fresh: list[CaseResult]
) -> tuple[dict[str, Any], list[CaseResult], float]:
    """The earlier run's results with ``fresh`` in place of its cases of the same keys, in CASES order.

    The earlier run's environment stays the report's; the rerun is listed in
    it (cases, commit, load, when), so a reader sees which rows are newer.
    """
    old_env, old_cases, old_seconds = load_json(path)
    if old_env["setup"]["quick"] != env["setup"]["quick"] or old_env["setup"]["what_if"] != env["setup"]["what_if"]:
        raise SystemExit(f"--merge: {path} was not made with the same --quick and what-if flags")
    by_key = {case.key: case for case in old_cases} | {case.key: case for case in fresh}
    old_env.setdefault("merged", []).append({
        "cases": [case.key for case in fresh],
        "commit": env["versions"]["commit"],
        "load": env["machine"]["load_average_start"],
        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    })
    ordered = [by_key[key] for key in CASES if key in by_key]
    return old_env, ordered, old_seconds + sum(case.seconds for case in fresh)


def _run_case(key: str, bench: Bench, plan: Plan, profiles: Path | None) -> CaseResult:
    """One case, under py-spy when asked (the worker that was up when the case began)."""
    if profiles is None or not bench.workers:
        return CASES[key](bench, plan)
    profiles.mkdir(parents=True, exist_ok=True)
    bench.profile_dir, bench.profile_case = profiles, key
    durable_only = getattr(sys.modules[CASES[key].__module__], "PROFILE_DURABLE_ONLY", False)
    try:
        if durable_only:
            result = CASES[key](bench, plan)
            what = "the durable runs"
        else:
            with recording(bench.workers[0].pid, profiles / f"{key}-0.txt"):
                result = CASES[key](bench, plan)
            what = "the whole case"
    finally:
        bench.profile_dir = None
    top = summarize(sorted(profiles.glob(f"{key}-*.txt")))
    if top:
        result.notes.append(
            f"py-spy --gil on the worker during {what} ({profiles.name}/{key}-*.txt); share of GIL samples "
            "by deepest engine frame: " + "; ".join(f"{share:.0f}% `{frame}`" for share, frame in top)
        )
    return result


if __name__ == "__main__":
    sys.exit(main())
