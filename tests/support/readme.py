"""The README's code blocks, and its commands run as a newcomer runs them
(``run_fresh``: no Redis configured, none on localhost:6379)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from celery_durable.local.redis_server import free_port

ROOT = Path(__file__).resolve().parents[2]

README = ROOT / "README.md"
_FENCE = re.compile(r"^```(?P<lang>\w*)\n(?P<code>.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int
    section: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.code.splitlines() if line.strip()]


def blocks() -> list[Block]:
    text = README.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()]
        headings = re.findall(r"^#{2,3} (.+)$", before, re.MULTILINE)
        found.append(Block(match["lang"], match["code"], before.count("\n") + 1, headings[-1] if headings else ""))
    return found


def in_section(section: str, lang: str = "bash") -> list[Block]:
    return [block for block in blocks() if block.section == section and block.lang == lang]


DEMO = ["demo"]
"""The README's first command, after the install (tests/test_demo.py runs it)."""


# `celery-durable`, with "localhost:6379" moved to a port where nothing listens
# (this machine may run a Redis there).
CLI = (
    "import celery_durable.local.embedded as e; e.LOCAL = ('127.0.0.1', {port}); "
    "from celery_durable.cli import main; main()"
)


def run_fresh(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("CELERY_DURABLE_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", CLI.format(port=free_port()), *args],
        cwd=tmp_path, env={**env, "COLUMNS": "160"}, capture_output=True, text=True, timeout=150,
    )


def readme_example_lines() -> list[list[str]]:
    """The README's examples block, one argv per line."""
    (block,) = in_section("Examples")
    return [shlex.split(line, comments=True) for line in block.lines]
