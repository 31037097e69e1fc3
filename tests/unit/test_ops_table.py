"""The table of storage operations (``broker/ops.py``) against the Lua it
describes: a script with no row, a row whose column the script belies, or a
script that carries the fence rule itself fails here."""

from __future__ import annotations

import re
from dataclasses import fields
from functools import cache

import pytest

from celery_durable.broker import ops
from celery_durable.broker.connection import LUA, _prelude_parts, script_source
from celery_durable.broker.ops import Activate, CallDone, Finish, Lock
from celery_durable.broker.schema.archive import ARCHIVABLE

WRITES = re.compile(
    r"redis\.call\('(HSET|HSETNX|HDEL|HINCRBY|SET|DEL|ZADD|ZREM\w*|XADD|XTRIM|EXPIRE|PEXPIRE|PERSIST|PUBLISH|SADD|SREM|INCR\w*)'"
)


@cache
def _prelude_calls() -> dict[str, frozenset[str]]:
    """Each prelude function, and the prelude functions it calls (the
    prelude as the loader cuts it, ``connection._prelude_parts``)."""
    bodies = {
        name: text[text.index(f"local function {name}(") :].split("\n", 1)[1]
        for name, text in _prelude_parts()
        if name is not None
    }
    return {f: frozenset(g for g in bodies if re.search(rf"\b{g}\(", body)) for f, body in bodies.items()}


@cache
def reaches(name: str, targets: frozenset[str]) -> bool:
    """Whether script ``name`` calls one of the prelude's ``targets``, itself
    or through other prelude functions: what a script may do, read from its
    Lua, against which the columns of ``ops.OPS`` are checked."""
    calls = _prelude_calls()
    reaching = set(targets)
    grew = True
    while grew:
        grew = False
        for function, called in calls.items():
            if function not in reaching and called & reaching:
                reaching.add(function)
                grew = True
    body = (LUA / f"{name}.lua").read_text(encoding="utf-8")
    return any(re.search(rf"\b{f}\(", body) for f in reaching)


def body(name: str) -> str:
    return (LUA / f"{name}.lua").read_text(encoding="utf-8")


def header(name: str) -> str:
    return "\n".join(line for line in body(name).splitlines() if line.startswith("--"))


def test_every_script_has_one_row_and_every_row_a_script() -> None:
    files = {p.name.removesuffix(".lua") for p in LUA.iterdir() if p.name.endswith(".lua") and p.name[0] != "_"}
    assert files == set(ops.OPS)


def test_the_columns_are_what_the_lua_does() -> None:
    waking = {name for name in ops.OPS if reaches(name, frozenset({"token_queued"}))}
    assert waking == ops.WAKING_SCRIPTS
    writing = {name for name in ops.OPS if reaches(name, frozenset({"set_status", "set_waiting"}))}
    assert writing - {"call", "call_done"} == ops.INDEXED_SCRIPTS  # the two rows say why not
    assert set(ops.WATCHED_CALLERS) <= ops.WAKING_SCRIPTS
    for name in ops.READS:
        assert not WRITES.search(body(name)), f"{name}.lua writes, yet its row reads only"
        assert not ops.OPS[name].indexed and not ops.OPS[name].wakes


@pytest.mark.parametrize("name", ops.SCRIPT_NAMES)
def test_the_fence_rule_is_the_preludes_alone(name: str) -> None:
    """No script fences itself: a fenced row's script starts behind the
    prelude's rule; any other row names why it is not fenced."""
    assert "fence(" not in body(name)
    fenced = ops.OPS[name].fenced
    assert fenced is True or (isinstance(fenced, str) and fenced)


@pytest.mark.parametrize("name", ops.SCRIPT_NAMES)
def test_a_rows_keys_are_its_headers(name: str) -> None:
    """As many named roles as the header's KEYS (``*``: KEYS[n..], the rest;
    ``?``: a key the caller adds when it has one)."""
    found = [int(n) for n in re.findall(r"KEYS\[(\d+)\]", header(name))]
    roles = ops.OPS[name].keys
    if roles == ("*",):
        assert re.search(r"KEYS\[1\.\.\d*\]", header(name)), name
        return
    assert max(found) == len([role for role in roles if role != "*"]), name
    # index_sync.lua's KEYS[5..] are run hashes, one Redis's only (run_index.py), not one owner's keys.
    assert ("*" in roles) == bool(re.search(r"KEYS\[\d+\.\.\]", header(name))) or name == "index_sync", name


@pytest.mark.parametrize("name", sorted(name for name, op in ops.OPS.items() if op.request))
def test_a_typed_request_names_the_argv_its_header_does(name: str) -> None:
    """Its fixed fields (a ``Lock`` spreads to four) are the header's ARGV,
    and a sequence field, its optional tail."""
    request = ops.OPS[name].request
    assert request is not None
    sizes = {"Lock": 4, "OpAt": 5, "Sequence[Any]": 0}
    fixed = sum(sizes.get(str(field.type), 1) for field in fields(request))
    tail = any(str(field.type) == "Sequence[Any]" for field in fields(request))
    last = max(int(n) for n in re.findall(r"ARGV\[(\d+)\]", header(name)))
    assert fixed == last if not tail else fixed < last


def test_a_request_spreads_into_argv() -> None:
    lock = Lock(30_000, 30_000, "events", "m-2")
    assert Activate(7, "m-1", 100, lock).argv() == [7, "m-1", 100, 30_000, 30_000, "events", "m-2"]
    assert Activate(7, "m-1", 100, lock, ("0", 3)).argv()[-2:] == ["0", 3]
    here = CallDone(7, 100, "k", "o{}", "", "p", ["p-1", lock, "0", 3, "1"]).argv()
    assert here == [7, 100, "k", "o{}", "", "p", "p-1", 30_000, 30_000, "events", "m-2", "0", 3, "1"]
    finish = Finish(7, 100, "events", "completed", "", "", False, True, "{}", "done", 0)
    assert finish.argv() == [7, 100, "events", "completed", "", "", 0, 1, "{}", "done", 0]


ARCHIVED_ROLES = {"history", "steps", "progress", "journal", "progress_phases", "*"}


@pytest.mark.parametrize(
    "name",
    sorted(
        name
        for name, op in ops.OPS.items()
        if op.fenced is not True and not op.reads_only and "run" in op.keys and ARCHIVED_ROLES & set(op.keys)
    ),
)
def test_a_script_the_fence_does_not_guard_refuses_a_run_settled_for_good(name: str) -> None:
    """A completed or cancelled run is never written again: ``archive_run.lua``
    folds its keys away on that rule, checking only their shape. The fence
    refuses every fenced script; any other that may write those keys refuses
    such a run itself, by name or by naming the statuses it accepts."""
    if name == "archive_run":
        lua = re.search(r"local ARCHIVABLE = \{([^}]*)\}", (LUA / "_prelude.lua").read_text(encoding="utf-8"))
        assert lua is not None and set(re.findall(r"(\w+) = true", lua.group(1))) == ARCHIVABLE
        return
    text = "\n".join(line for line in body(name).splitlines() if not line.lstrip().startswith("--"))
    assert "ARCHIVABLE[" in text or "~= 'running'" in text, f"{name}.lua may write a run settled for good"


def test_a_script_carries_the_prelude_functions_it_needs_and_no_other() -> None:
    """The loader's cut (``connection._prelude_for``): every prelude function a
    script's body calls, through others or itself, is in its source; one it
    never reaches is not; and a cut that lost a line of the prelude would
    leave a function out of every script."""
    named = [name for name, _ in _prelude_parts() if name is not None]
    assert len(named) == (LUA / "_prelude.lua").read_text(encoding="utf-8").count("\nlocal function ")
    calls = _prelude_calls()
    for script in ops.SCRIPT_NAMES:
        source = script_source(script)
        for function in named:
            if reaches(script, frozenset({function})) or (function == "fence" and script in ops.FENCED):
                assert f"local function {function}(" in source, f"{script}.lua lacks {function}"
        assert "local function fence(" in source or script not in ops.FENCED
    assert "local function throttle_admit(" not in script_source("look")
    assert calls  # the graph the other tests read


CACHED_RUN_FIELDS = ("id", "attempt", "progress_max", "recoveries")
"""The run fields a script reads once (``RUN_FIELDS`` in ``_prelude.lua``,
seeded by the fence): a write that goes around the helpers that keep that
cache would leave the rest of the script reading the old value."""
CACHE_KEEPERS = {"add_attempt", "made_progress", "count_recovery"}
CACHED_LITERAL = re.compile(r"""['"](""" + "|".join(CACHED_RUN_FIELDS) + r""")['"]""")
CALL_START = re.compile(r"""redis\.p?call\(\s*['"](\w+)['"]|\b(\w+)\(""")
HASH_WRITES = {"HSET", "HSETNX", "HMSET", "HDEL", "HINCRBY", "HINCRBYFLOAT"}
WRITERS = {"set_status"}
"""The prelude's writer of run hash fields named by its caller."""
COMMENT = re.compile(r"--[^\n]*")


def _cached_field_writes(where: str, text: str) -> list[str]:
    """Each literal name of a cached field in ``text`` (comments aside) that a
    hash write, or a writer, takes."""
    text = COMMENT.sub("", text)
    found = []
    for literal in CACHED_LITERAL.finditer(text):
        calls = list(CALL_START.finditer(text, 0, literal.start()))
        command, function = (calls[-1].group(1), calls[-1].group(2)) if calls else (None, None)
        if (command or "").upper() in HASH_WRITES or function in WRITERS:
            line = text.count("\n", 0, literal.start()) + 1
            found.append(f"{where}:{line}: {literal.group(0)} in {command or function}")
    return found


def test_the_run_fields_a_script_caches_are_written_only_through_the_helpers_that_keep_the_cache() -> None:
    """Every literal name of a cached field sits in a read (a field named by
    a variable escapes this check: none is, today)."""
    offenders = []
    for name in ops.SCRIPT_NAMES:
        if name != "create_run":  # writes the record before anything of it is read
            offenders += _cached_field_writes(f"{name}.lua", body(name))
    for function, text in _prelude_parts():
        if function is not None and function not in CACHE_KEEPERS:
            offenders += _cached_field_writes(f"_prelude.lua {function}", text)
    assert not offenders
