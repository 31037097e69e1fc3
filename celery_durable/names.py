"""The one rule for names that end up in Redis keys, queues and URLs.

Workflow names, namespaces and key prefixes are all plain names: a short run
of ``[A-Za-z0-9._-]``, nothing a key, a shell or a URL would have to escape.
Only the length differs. This module imports nothing of the package, so
``config``, ``broker`` and ``workflows`` can all share it without breaking
their layering.
"""

from __future__ import annotations

import re
from typing import Final

NAME_CHARS: Final = "A-Za-z0-9._-"
NAMESPACE_MAX: Final = 64
"""Namespaces and key prefixes: every key of a run carries one."""
WORKFLOW_NAME_MAX: Final = 128
SIGNAL_NAME_MAX: Final = 128
"""Signal names: they are part of op identities and of the CLI's arguments."""


def name_pattern(max_length: int) -> re.Pattern[str]:
    """A pattern for the whole text: ``\\A``/``\\Z``, because ``$`` also
    matches before a trailing newline and ``"ns\\n"`` must not pass."""
    return re.compile(rf"\A[{NAME_CHARS}]{{1,{max_length}}}\Z")


def name_rule(max_length: int) -> str:
    """The rule in words, for error messages."""
    return f"1-{max_length} characters of [{NAME_CHARS}]"


NAMESPACE_PATTERN: Final = name_pattern(NAMESPACE_MAX)
WORKFLOW_NAME_PATTERN: Final = name_pattern(WORKFLOW_NAME_MAX)
SIGNAL_NAME_PATTERN: Final = name_pattern(SIGNAL_NAME_MAX)
