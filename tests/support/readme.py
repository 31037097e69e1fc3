"""The README's code blocks, for the tests that run them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
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
