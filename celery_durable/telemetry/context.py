"""A run's place in a trace: W3C ``traceparent`` text, parsed without OpenTelemetry.

A run records the trace context it was started under (``trace_parent`` in
its run hash) and each later attempt the span that began it
(``trace_attempt``). Both are stored as W3C ``traceparent`` text, the format
every OpenTelemetry propagator and vendor reads, so a worker continues the
caller's trace whatever SDK either side configured. Parsing lives here, apart
from the OpenTelemetry code, because the client records a carried context
(the ``TRACEPARENT`` variable the CLI reads) even where OpenTelemetry is not
installed: the workers may have it.

A run started under no trace still gets one: its trace id is its run id, so
an operator who knows the run finds its trace, and every worker and attempt
agrees on it without a word stored.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass

logger = logging.getLogger(__name__)

TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
"""Version, trace id, parent span id, flags (W3C Trace Context, level 1)."""
SAMPLED = 0x01
WARNED_MAX = 1024
"""How many bad stored contexts a process remembers having warned about."""

_warned: set[str] = set()


@dataclass(frozen=True, slots=True)
class Parent:
    """A remote parent span: the ids OpenTelemetry's ``SpanContext`` takes."""

    trace_id: int
    span_id: int
    flags: int

    def traceparent(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"


def parse_traceparent(text: str) -> Parent | None:
    """The parent ``text`` names, or None when it is not a valid traceparent
    (an unknown version may carry more fields after these four, as the
    specification allows; version ff and all-zero ids are invalid)."""
    if not isinstance(text, str):
        return None
    text = text.strip().lower()
    found = TRACEPARENT.match(text)
    if found is None or (len(text) > 55 and (found.group(1) == "00" or text[55] != "-")):
        return None
    version, trace_id, span_id, flags = found.groups()
    if version == "ff" or int(trace_id, 16) == 0 or int(span_id, 16) == 0:
        return None
    return Parent(int(trace_id, 16), int(span_id, 16), int(flags, 16))


def carried(text: str | None, source: str) -> str:
    """A traceparent given from outside (``source`` says where), checked:
    one that does not parse is ignored with a warning, never a failed start."""
    if not text:
        return ""
    parent = parse_traceparent(text)
    if parent is None:
        logger.warning("%s is not a W3C traceparent (%.80r); the run starts without that trace context", source, text)
        return ""
    return parent.traceparent()


def run_parent(run_id: str, trace_parent: str, trace_attempt: str = "") -> Parent:
    """The parent of every span an attempt of the run makes.

    The attempt's own anchor when it has one, else the run's; a stored value
    that does not parse (written by hand, or damaged) is ignored with one
    warning per process, and the run falls back to the trace named by its id.
    """
    for text in (trace_attempt, trace_parent):
        if not text:
            continue
        parent = parse_traceparent(text)
        if parent is not None:
            return parent
        if text not in _warned and len(_warned) < WARNED_MAX:
            _warned.add(text)
            logger.warning("run %s: its stored trace context %.80r is not a W3C traceparent; ignored", run_id, text)
    return own_trace(run_id)


def own_trace(run_id: str) -> Parent:
    """The trace of a run started under none: the run id (a uuid4's 32 hex
    digits) is the trace id; any other id is hashed to one."""
    digest = hashlib.sha256(run_id.encode("utf-8")).digest()
    try:
        trace_id = int(run_id, 16) if len(run_id) == 32 else 0
    except ValueError:
        trace_id = 0
    trace_id = trace_id or int.from_bytes(digest[:16], "big") or 1
    return Parent(trace_id, int.from_bytes(digest[16:24], "big") or 1, SAMPLED)
