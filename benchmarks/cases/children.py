"""Case 15: child runs (SPEC §5b) — a parallel of n ``ctx.child`` calls vs the
same work as n branches of one run.

Each branch of ``bench.children`` starts a child run of ``bench.leaf`` (one
no-op step) and waits for it holding no worker slot; the child is a run of
its own (created, listed, activated, settled), and its settling journals its
result in the parent and wakes the waiting branch. The baseline column is
not plain Celery here: it is ``bench.fanout``, the same no-op step as n
branches of one run, so the ratio is what making each branch a run costs.

A parent waiting for many children must cost O(1) Redis work per child that
settles, not a rescan of its other waits: Redis commands per child (``INFO
commandstats`` over the run, Lua's own commands included) are measured at
each size, and their growth from the smallest to the largest size is judged.
"""

from __future__ import annotations

from benchmarks.cases.common import fmt_int
from benchmarks.harness import Bench
from benchmarks.model import CaseResult, Row, Target, median
from benchmarks.plan import Plan
from benchmarks.redisstats import CommandWindow

CASE = "15. Children"
GROWTH_LIMIT = 1.25
"""Redis commands per child at the largest size over those at the smallest: flat, give or take noise."""
CHILDREN = "children"
BRANCHES = "branches"


def run(bench: Bench, plan: Plan) -> CaseResult:
    sizes = plan.children_sizes
    result = CaseResult(
        key="children",
        title=f"Children: ctx.parallel of {fmt_int(sizes[-1])} child runs vs the same work as "
        f"{fmt_int(sizes[-1])} branches",
        setup=f"Durable: bench.children, a parallel of n ctx.child('c<i>', 'bench.leaf') (a child run of one no-op "
        f"step each), at n = {', '.join(fmt_int(n) for n in sizes)}; time from start to the parent completed "
        "(every child settled). Baseline column: bench.fanout, n branches of the same no-op step in one run "
        "(not plain Celery). Redis commands from INFO commandstats around each run (client polling included).",
    )
    bench.run("bench.children", {"n": 4}, plan.timeout)  # warm-up: scripts loaded, connections made
    bench.run("bench.fanout", {"n": 4}, plan.timeout)
    times: dict[int, dict[str, list[float]]] = {}
    commands: dict[int, dict[str, list[float]]] = {}
    for n in sizes:
        times[n] = {CHILDREN: [], BRANCHES: []}
        commands[n] = {CHILDREN: [], BRANCHES: []}
        for r in range(plan.repeat):
            for label in ([CHILDREN, BRANCHES] if r % 2 == 0 else [BRANCHES, CHILDREN]):
                workflow = "bench.children" if label == CHILDREN else "bench.fanout"
                with CommandWindow(bench.raw) as window:
                    seconds, envelope = bench.run(workflow, {"n": n}, plan.timeout)
                if envelope.result != n:
                    raise RuntimeError(f"{workflow} of {n} returned {envelope.result!r}")
                times[n][label].append(seconds)
                commands[n][label].append(window.commands.total / n)
    for n in sizes:
        result.rows += [
            Row(CASE, f"parallel of {fmt_int(n)} child runs vs {fmt_int(n)} branches (baseline: branches)", "s",
                times[n][CHILDREN], times[n][BRANCHES]),
            Row(CASE, f"time per child at {fmt_int(n)}", "ms", [1000 * t / n for t in times[n][CHILDREN]],
                [1000 * t / n for t in times[n][BRANCHES]]),
            Row(CASE, f"Redis commands per child at {fmt_int(n)}", "commands", commands[n][CHILDREN],
                commands[n][BRANCHES], note="per branch in the baseline column"),
        ]
    first, last = sizes[0], sizes[-1]
    growth = median(commands[last][CHILDREN]) / median(commands[first][CHILDREN])
    result.rows.append(
        Row(CASE, f"Redis commands per child, {fmt_int(last)} vs {fmt_int(first)}", "x", [growth],
            target=Target(f"<= {GROWTH_LIMIT}x: O(1) per child settling", GROWTH_LIMIT), checked=growth)
    )
    result.details = {
        "seconds": {str(n): times[n] for n in sizes},
        "redis_commands_per_item": {str(n): commands[n] for n in sizes},
    }
    return result
