"""RESULTS.md and results.json: the machine, the versions, the table, the notes.

The table is generated; the analysis of misses (profiler evidence and the
recommended engine fixes) is hand-written in ``benchmarks/NOTES.md`` and
included verbatim, so regenerating the results never loses it.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any

from benchmarks.harness import APPENDFSYNC, ROOT, WorkerSetup
from benchmarks.model import CaseResult, Row, Target
from benchmarks.plan import Plan

NOTES = Path(__file__).resolve().parent / "NOTES.md"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return math.nan


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _commit() -> str:
    """The checked-out commit, read from .git without running git; ``BENCH_COMMIT`` names it for a
    tree that has no .git (a ``git archive`` snapshot, see README)."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"][:12]
    head = ROOT / ".git" / "HEAD"
    try:
        ref = head.read_text().strip()
        if ref.startswith("ref: "):
            target = ROOT / ".git" / ref[5:]
            if target.exists():
                return target.read_text().strip()[:12]
            for line in (ROOT / ".git" / "packed-refs").read_text().splitlines():
                if line.endswith(ref[5:]):
                    return line.split()[0][:12]
        return ref[:12]
    except OSError:
        return "unknown"


def environment(
    redis_version: str, setup: WorkerSetup, plan: Plan, load: dict[str, Any], what_if: dict[str, Any]
) -> dict[str, Any]:
    return {
        "machine": {
            "nproc": os.cpu_count(),
            "cpu": _cpu_model(),
            "ram_gib": round(_ram_gib(), 1),
            "platform": platform.platform(),
            "load_average_start": load.get("start"),
            "load_average_end": load.get("end"),
        },
        "versions": {
            "python": sys.version.split()[0],
            "celery": _version("celery"),
            "kombu": _version("kombu"),
            "redis-py": _version("redis"),
            "hiredis": _version("hiredis"),
            "redis-server": redis_version,
            "celery-durable": _version("celery-durable"),
            "commit": _commit(),
        },
        "setup": {
            "workers": setup.workers,
            "pool": setup.pool,
            "concurrency": setup.concurrency,
            "appendfsync": APPENDFSYNC,
            "repeat": plan.repeat,
            "quick": plan.quick,
            "what_if": what_if,
        },
    }


def _clean(value: Any) -> Any:
    """JSON has no NaN: NaN becomes null, recursively."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def load_json(path: Path) -> tuple[dict[str, Any], list[CaseResult], float]:
    """Read results.json back, so RESULTS.md can be rendered again (e.g. after NOTES.md changed)."""
    data = json.loads(path.read_text())
    cases: list[CaseResult] = []
    for raw in data["cases"]:
        rows = []
        for row in raw["rows"]:
            target = Target(**row["target"]) if row.get("target") else None
            rows.append(Row(
                case=row["case"], figure=row["figure"], unit=row["unit"],
                samples=[math.nan if v is None else v for v in row["samples"]],
                baseline_samples=row["baseline_samples"], target=target, checked=row["checked"],
                judge_ratio=row["judge_ratio"], note=row["note"],
            ))
        cases.append(CaseResult(
            key=raw["key"], title=raw["title"], setup=raw["setup"], rows=rows, details=raw["details"],
            notes=raw["notes"], error=raw["error"], seconds=raw["seconds"], load=raw.get("load", []),
        ))
    return data["environment"], cases, float(data["seconds"])


def _compact(value: Any) -> Any:
    """Details as the report shows them: floats rounded, long sample lists summarised."""
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {str(k): _compact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if len(value) > 12 and all(isinstance(v, int | float) for v in value):
            low, mid, high = sorted(value)[0], sorted(value)[len(value) // 2], max(value)
            return f"{len(value)} values, min {low:.4g}, median {mid:.4g}, max {high:.4g}"
        return [_compact(v) for v in value]
    return value


def write_json(path: Path, env: dict[str, Any], cases: list[CaseResult], seconds: float) -> None:
    data = {"environment": env, "seconds": seconds, "cases": [case.to_json() for case in cases]}
    path.write_text(json.dumps(_clean(data), indent=2, allow_nan=False) + "\n")


def _num(value: float | None, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    magnitude = abs(value)
    if magnitude >= 100 or unit in ("bytes", "MB"):
        return f"{value:,.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def _row_md(row: Row) -> str:
    ratio = f"{row.ratio:.2f}x" if row.ratio is not None else "-"
    target = row.target.text if row.target else ""
    verdict = f"**{row.verdict}**" if row.verdict else ""
    value = f"{_num(row.value, row.unit)} {row.unit}"
    base = f"{_num(row.baseline, row.unit)} {row.unit}" if row.baseline is not None else "-"
    runs = len(row.samples)
    return f"| {row.case} | {row.figure} | {value} | {base} | {ratio} | {runs} | {target} | {verdict} | {row.note} |"


def write_markdown(path: Path, env: dict[str, Any], cases: list[CaseResult], seconds: float) -> None:
    machine, versions, setup = env["machine"], env["versions"], env["setup"]
    lines = [
        "# celery-durable vs plain Celery",
        "",
        "Generated by `python -m benchmarks"
        + (" --quick" if setup["quick"] else "")
        + f" --repeat {setup['repeat']}`; do not edit by hand (the notes come from `benchmarks/NOTES.md`).",
        "",
        "Both sides run in the same session, on the same private `redis-server` (append-only file on, "
        f"`appendfsync {setup['appendfsync']}`), through the same Celery app configuration (the engine's: JSON, "
        "`acks_late`, prefetch 1, task events) and the same worker processes: "
        f"{setup['workers']} x `celery-durable worker --app benchmarks.app:engine -P {setup['pool']} "
        f"-c {setup['concurrency']}`. Plain Celery waits for results through a Redis result backend (db 1 of the "
        "same server), configured for the benchmark app only; the durable side needs none (the journal holds "
        "the results). Each figure is the median of the runs shown; the ratio is durable / plain Celery. "
        "This machine is shared and noisy: read the ratios, not the absolute times.",
        "",
        "## Machine and versions",
        "",
        f"- machine: {machine['nproc']} CPUs ({machine['cpu']}), {machine['ram_gib']} GiB RAM, {machine['platform']}",
        f"- load average (1, 5, 15 min) at start: {machine['load_average_start']}, "
        f"at end: {machine['load_average_end']}",
        f"- Python {versions['python']}, Celery {versions['celery']}, kombu {versions['kombu']}, "
        f"redis-py {versions['redis-py']} (hiredis: {versions['hiredis']}), Redis {versions['redis-server']}",
        f"- celery-durable {versions['celery-durable']} at commit {versions['commit']} "
        "(plus whatever the work tree held uncommitted at the time)",
        f"- whole run: {seconds:.0f} s",
        *(
            f"- rerun later and merged in (`--merge`): {', '.join(m['cases'])} at commit {m['commit']}, "
            f"{m['at']}, load average {m['load']}"
            for m in env.get("merged", [])
        ),
        *(
            [f"- **what-if run, not the engine as shipped:** {setup['what_if']}"]
            if setup.get("what_if")
            else []
        ),
        "",
        "## Results",
        "",
        "| case | figure | celery-durable | plain Celery | ratio | runs | target | verdict | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    rows = sorted((row for case in cases for row in case.rows), key=lambda row: row.case.split(".")[0])
    lines += [_row_md(row) for row in rows]
    lines += ["", "## Cases", ""]
    for case in cases:
        lines.append(f"### {case.title}")
        lines.append("")
        load = f"; load average {case.load[0]:.1f} -> {case.load[-1]:.1f}" if case.load else ""
        lines.append(f"{case.setup} ({case.seconds:.0f} s{load})")
        if case.error:
            lines += ["", f"**The case failed:** `{case.error}`"]
        for note in case.notes:
            lines += ["", note]
        if case.details:
            lines += ["", "<details><summary>details</summary>", "", "```json",
                      json.dumps(_compact(_clean(case.details)), indent=1), "```", "", "</details>"]
        lines.append("")
    if NOTES.exists():
        lines += ["## Notes on the misses", "", NOTES.read_text().strip(), ""]
    path.write_text("\n".join(lines) + "\n")
