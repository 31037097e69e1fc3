"""What a command prints for scripts goes to stdout alone.

The user's ``--app`` module runs in the command's process: a ``print`` at
import, or a console span exporter (OpenTelemetry's ``ConsoleSpanExporter``
writes each span as JSON to stdout, even at exit), would mix with the run id
``runs start`` prints for ``RUN=$(celery-durable runs start …)``. So once the
command is about to load that module, file descriptor 1 is pointed at stderr
for the rest of the process (everything else writes there, at any level:
``sys.stdout``, a stream captured before, a C library), and the command's
own results go to a duplicate of the real stdout kept aside.

Only the ``celery-durable`` process does this (``main`` turns it on): a
command invoked in-process (Typer's ``CliRunner``, a test) keeps its
stdout untouched.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console


class _Diversion:
    enabled = False
    stream: TextIO | None = None


_diversion = _Diversion()


def enable() -> None:
    """Called by ``main`` before the command runs."""
    _diversion.enabled = True


def divert(console: Console) -> None:
    """Before user code is loaded: fd 1 to stderr for good, ``console``
    (and ``stream()``) to the real stdout. Once; a no-op unless enabled."""
    if not _diversion.enabled or _diversion.stream is not None:
        return
    sys.stdout.flush()
    kept = os.dup(1)
    os.dup2(2, 1)
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    _diversion.stream = os.fdopen(kept, "w", encoding=encoding, errors="replace", buffering=1)
    console.file = _diversion.stream


def stream() -> TextIO:
    """Where results go: the real stdout kept aside, else ``sys.stdout``."""
    return _diversion.stream or sys.stdout


def flush() -> None:
    if _diversion.stream is not None:
        _diversion.stream.flush()
