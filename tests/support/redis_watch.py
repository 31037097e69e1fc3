"""Proof that something wrote nothing: every key under a prefix dumped
before and after (``DUMP``), and every command Redis ran meanwhile
(``MONITOR``, which shows the commands inside Lua scripts too)."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import redis


def dump_keys(url: str, prefix: str) -> dict[bytes, tuple[bytes | None, bool]]:
    """Every key under ``prefix``: its ``DUMP`` (type, value and encoding), and whether it expires."""
    client = redis.Redis.from_url(url)
    try:
        keys = sorted(client.scan_iter(match=f"{prefix}*".encode(), count=1000))
        return {key: (client.dump(key), client.pttl(key) > 0) for key in keys}
    finally:
        client.close()


@contextlib.contextmanager
def writes_seen(url: str, prefix: str) -> Iterator[list[str]]:
    """The write commands (and PUBLISHes) Redis runs on keys under ``prefix``
    while the block runs: the list is filled once the block ends."""
    client = redis.Redis.from_url(url, decode_responses=True)
    start, end = f"watch-start-{uuid.uuid4().hex}", f"watch-end-{uuid.uuid4().hex}"
    seen: list[str] = []
    started = threading.Event()

    def listen() -> None:
        with client.monitor() as monitor:
            client.echo(start)
            for command in monitor.listen():
                text = str(command["command"])
                if start in text:
                    started.set()
                elif end in text:
                    return
                elif started.is_set():
                    seen.append(text)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert started.wait(10), "MONITOR did not start"
    found: list[str] = []
    try:
        yield found
    finally:
        client.echo(end)
        listener.join(10)
        writes = _write_commands(client, {text.split(" ", 1)[0].lower() for text in seen})
        found.extend(text for text in seen if text.split(" ", 1)[0].lower() in writes and prefix in text)
        client.close()


def _write_commands(client: Any, names: set[str]) -> set[str]:
    """Which of ``names`` Redis flags as writes (PUBLISH too: it is what a change announces)."""
    writes = {"publish"}
    for name in names - writes:
        info = client.execute_command("COMMAND", "INFO", name) or {}
        if "write" in (info.get(name) or {}).get("flags", []):
            writes.add(name)
    return writes
