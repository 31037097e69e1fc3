"""The namespace indexes (by status, workflow, waiting, id, time: issue 28)
against the run records, and the listings that read them.

Every index is compared with the records member by member
(``tests/support/index_check.py``): after a mix of runs that complete, fail, wait
for a signal, a timer and a child, are cancelled and signalled; after a
Redis restart from its AOF; after retention. ``tests/test_cluster.py`` runs
the first ones again on a Redis Cluster, where the indexes live in another
slot than the runs.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from celery_durable import Engine, RunNotFoundError, Settings, define_workflow
from celery_durable.local.redis_server import RedisServer, free_port
from tests.conftest import Durable
from tests.support.index_check import disagreements
from tests.support.poll import RUN_BOUND, poll

TIMEOUT = 30.0


def workflow(name: str, run: Callable[[Any], Any]) -> Any:
    return define_workflow({"name": name, "description": f"{name} (index test)", "phases": []}, run)


QUICK = workflow("quick", lambda ctx: ctx.step("one", lambda: 1))
BOOM = workflow("boom", lambda ctx: ctx.step("explode", lambda: 1 / 0))
APPROVAL = workflow("approval", lambda ctx: ctx.wait_for_signal("approval").payload)
NAP = workflow("nap", lambda ctx: ctx.sleep(3600))
PARENT = workflow("parent", lambda ctx: ctx.child("kid", "approval"))
ALL = [QUICK, BOOM, APPROVAL, NAP, PARENT]


def waiting_for(d: Durable, run_id: str) -> str | None:
    """The name the run waits for ('' a timer), None when it waits for nothing or is not there yet."""
    try:
        waiting = d.client.get_workflow_run(run_id).snapshot["waiting_for"]
    except RunNotFoundError:  # a child its parent waits for, about to be created
        return None
    return None if waiting is None else str(waiting["name"])


def ids(page: Any) -> list[str]:
    return [run.run_id for run in page.runs]


def mixed_runs(d: Durable) -> dict[str, list[str]]:
    """Runs of every kind, each settled or waiting as its name says."""
    started = {
        "quick": [d.client.start_workflow("quick") for _ in range(3)],
        "boom": [d.client.start_workflow("boom") for _ in range(2)],
        "approval": [d.client.start_workflow("approval") for _ in range(4)],
        "nap": [d.client.start_workflow("nap")],
        "parent": [d.client.start_workflow("parent")],
    }
    for run_id in started["quick"] + started["boom"]:
        d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    for run_id in started["approval"]:
        poll(
            lambda r=run_id: waiting_for(d, r) == "approval",
            within=RUN_BOUND,
            what="the run to wait for approval",
        )
    poll(lambda: waiting_for(d, started["nap"][0]) == "", within=RUN_BOUND, what="the nap's timer")
    parent = started["parent"][0]
    kid = poll(lambda: waiting_for(d, parent), within=RUN_BOUND, what="the parent to wait for its child")
    poll(lambda: waiting_for(d, kid) == "approval", within=RUN_BOUND, what="the child to wait for approval")
    started["kid"] = [kid]
    d.client.signal_workflow_run(started["approval"][0], "approval", "yes")
    d.client.wait_for_workflow_run(started["approval"][0], timeout=TIMEOUT)
    d.client.cancel_workflow_run(started["approval"][1], timeout=TIMEOUT)
    return started


def agree(d: Durable) -> None:
    """The indexes agree with the records once the syncs under way have
    landed: on a Cluster a worker syncs them in a round trip of its own after
    the script that settled a run (intent, script, sync: run_index.py), and a
    client that saw the record settled can look between the two."""
    found: list[str] = []

    def agreed() -> bool:
        found[:] = disagreements(d.engine.store, "default")
        return not found

    if not agreed():
        poll(agreed, within=RUN_BOUND, what=f"the indexes to agree with the records (first look: {found})")


@pytest.mark.topologies("redis", "cluster")
def test_indexes_agree_with_the_records_through_a_mix_of_runs(durable) -> None:
    d = durable(ALL)
    assert disagreements(d.engine.store, "default") == []
    runs = mixed_runs(d)
    agree(d)

    approval, kid = runs["approval"], runs["kid"][0]
    assert set(ids(d.client.list_workflow_runs(waiting="approval"))) == {approval[2], approval[3], kid}
    waiting = {approval[2], approval[3], kid, runs["nap"][0], runs["parent"][0]}
    assert set(ids(d.client.list_workflow_runs(waiting=True))) == waiting
    assert ids(d.client.list_workflow_runs(waiting=kid)) == runs["parent"]
    assert ids(d.client.list_workflow_runs(waiting="nobody")) == []
    assert ids(d.client.list_workflow_runs(status="error")) == runs["boom"][::-1]
    assert ids(d.client.list_workflow_runs(status="cancelled", workflow="approval")) == [approval[1]]
    assert ids(d.client.list_workflow_runs("completed", "approval")) == [approval[0]]
    assert set(ids(d.client.list_workflow_runs(status="running", waiting="approval"))) == {
        approval[2],
        approval[3],
        kid,
    }
    assert ids(d.client.list_workflow_runs(workflow="quick", waiting=True)) == []

    # Signalled: it leaves the waiting indexes, in the same write.
    d.client.signal_workflow_run(approval[2], "approval", "later")
    assert d.client.wait_for_workflow_run(approval[2], timeout=TIMEOUT).status == "completed"
    assert set(ids(d.client.list_workflow_runs(waiting="approval"))) == {approval[3], kid}
    agree(d)


@pytest.mark.topologies("redis", "cluster")
def test_a_cursor_from_before_a_run_changed_status_neither_skips_nor_repeats(durable) -> None:
    d = durable([APPROVAL])
    runs = [d.client.start_workflow("approval") for _ in range(6)]
    for run_id in runs:
        poll(lambda r=run_id: waiting_for(d, r) == "approval", within=RUN_BOUND, what="the run to wait")
    newest_first = runs[::-1]

    first = d.client.list_workflow_runs(waiting="approval", limit=2)
    assert ids(first) == newest_first[:2]
    # One run given and one not given yet leave the filter; the others stay.
    for run_id in (newest_first[1], newest_first[3]):
        d.client.signal_workflow_run(run_id, "approval", None)
        d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    rest: list[str] = []
    cursor = first.next_cursor
    while cursor is not None:
        page = d.client.list_workflow_runs(waiting="approval", limit=2, cursor=cursor)
        rest.extend(ids(page))
        cursor = page.next_cursor
    assert rest == [newest_first[2], newest_first[4], newest_first[5]]

    # A workflow filter the runs all stay in, across status changes: the same.
    first = d.client.list_workflow_runs(workflow="approval", limit=3)
    for run_id in newest_first[4:]:
        d.client.signal_workflow_run(run_id, "approval", None)
        d.client.wait_for_workflow_run(run_id, timeout=TIMEOUT)
    second = d.client.list_workflow_runs(workflow="approval", limit=3, cursor=first.next_cursor)
    assert ids(first) + ids(second) == newest_first
    assert second.next_cursor is None


def test_run_id_prefix_and_time_range(durable) -> None:
    d = durable([QUICK])
    early = [d.client.run_workflow("quick", timeout=TIMEOUT) for _ in range(3)]
    middle = datetime.now(UTC) + timedelta(milliseconds=5)
    poll(lambda: datetime.now(UTC) > middle + timedelta(milliseconds=5), within=RUN_BOUND, what="time to pass")
    late = [d.client.run_workflow("quick", timeout=TIMEOUT) for _ in range(3)]
    every = [run.run_id for run in early + late]

    target = every[1]
    for size in (1, 4, 32):
        found = ids(d.client.list_workflow_runs(run_id_prefix=target[:size]))
        assert target in found
        assert found == sorted(r for r in every if r.startswith(target[:size]))
    assert ids(d.client.list_workflow_runs(run_id_prefix=target, status="error")) == []
    # Paging by id: every run of the prefix once, in id order.
    paged: list[str] = []
    cursor = None
    while True:
        page = d.client.list_workflow_runs(run_id_prefix=target[:1], limit=1, cursor=cursor)
        paged.extend(ids(page))
        cursor = page.next_cursor
        if cursor is None:
            break
    assert paged == sorted(r for r in every if r.startswith(target[:1]))

    assert ids(d.client.list_workflow_runs(created_before=middle)) == [r.run_id for r in early][::-1]
    assert ids(d.client.list_workflow_runs(created_after=middle)) == [r.run_id for r in late][::-1]
    assert (
        ids(d.client.list_workflow_runs(created_after=middle, status="completed", limit=2))
        == [r.run_id for r in late][::-1][:2]
    )
    start = datetime.fromtimestamp(early[1].created_at.timestamp(), UTC)
    assert ids(d.client.list_workflow_runs(created_after=start, created_before=middle)) == [
        early[2].run_id,
        early[1].run_id,
    ]


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"waiting": ""}, "waiting"),
        ({"waiting": 3}, "waiting"),
        ({"waiting": False}, "waiting"),
        ({"waiting": "a|b"}, "waiting"),
        ({"run_id_prefix": "XYZ"}, "run_id_prefix"),
        ({"run_id_prefix": ""}, "run_id_prefix"),
        ({"run_id_prefix": "0" * 33}, "run_id_prefix"),
        ({"created_after": "2024-01-01"}, "created_after"),
        ({"created_before": datetime(2024, 1, 1)}, "naive"),
        (
            {"created_after": datetime(2024, 1, 2, tzinfo=UTC), "created_before": datetime(2024, 1, 1, tzinfo=UTC)},
            "earlier",
        ),
        ({"workflow": "no spaces"}, "workflow"),
        ({"status": "error", "cursor": "s12"}, "cursor"),
        ({"cursor": "o123"}, "cursor"),
        ({"run_id_prefix": "ab", "cursor": "iXYZ"}, "cursor"),
    ],
)
def test_bad_filters_are_refused_naming_the_problem(durable, kwargs: dict[str, Any], named: str) -> None:
    d = durable([QUICK], worker=False)
    with pytest.raises(ValueError, match=named):
        d.client.list_workflow_runs(**kwargs)


def test_the_positional_signature_stays_and_the_new_filters_are_keyword_only(durable) -> None:
    d = durable([QUICK], worker=False)
    assert d.client.list_workflow_runs(None, None, 50, None).runs == []
    with pytest.raises(TypeError):
        d.client.list_workflow_runs(None, None, 50, None, True)  # type: ignore[misc]


@pytest.mark.topologies("redis", "cluster")
def test_retention_takes_runs_out_of_every_index(durable, raw_redis) -> None:
    d = durable([QUICK, BOOM], run_retention_seconds=1)
    done = [d.client.run_workflow(name, timeout=TIMEOUT).run_id for name in ("quick", "boom", "quick")]
    ns = d.engine.store.keys.namespace("default")
    assert raw_redis.zcard(ns.index) == 15
    poll(
        lambda: not any(raw_redis.exists(d.engine.store.run_keys(r).run) for r in done),
        within=RUN_BOUND,
        what="the runs to expire",
    )
    # The sweep's pass: retention runs out, the runs leave every index.
    poll(
        lambda: d.engine.store.prune_expired(d.engine.store.now_ms(), 100) >= 0 and not raw_redis.zcard(ns.runs),
        within=RUN_BOUND,
        what="the sweep to prune them",
    )
    assert raw_redis.zcard(ns.index) == 0
    assert raw_redis.hlen(ns.index_state) == 0
    assert disagreements(d.engine.store, "default") == []


@pytest.mark.topologies("redis", "cluster")
def test_a_listing_that_meets_expired_runs_takes_them_out_of_every_index(durable, raw_redis) -> None:
    d = durable([QUICK])
    gone, kept = (d.client.run_workflow("quick", timeout=TIMEOUT).run_id for _ in range(2))
    store = d.engine.store
    raw_redis.delete(*[key for key in vars_of(store.run_keys(gone))])  # what expiry does
    assert ids(d.client.list_workflow_runs(status="completed")) == [kept]
    assert disagreements(store, "default") == []


def vars_of(keys: Any) -> list[str]:
    return [getattr(keys, name) for name in keys.__slots__]


@pytest.mark.topologies("redis", "cluster")
def test_a_store_written_before_the_indexes_lists_correctly_and_reindex_builds_them(durable, raw_redis) -> None:
    d = durable([QUICK, BOOM, APPROVAL])
    made = {name: d.client.start_workflow(name) for name in ("quick", "boom", "approval")}
    d.client.wait_for_workflow_run(made["quick"], timeout=TIMEOUT)
    d.client.wait_for_workflow_run(made["boom"], timeout=TIMEOUT)
    poll(lambda: waiting_for(d, made["approval"]) == "approval", within=RUN_BOUND, what="the run to wait")
    store, ns = d.engine.store, d.engine.store.keys.namespace("default")
    # As an older version left it: the runs zset, no index, no version field.
    raw_redis.delete(ns.index, ns.index_state, ns.index_meta)
    for run_id in made.values():
        raw_redis.hdel(store.run_keys(run_id).run, "ixv")
    assert not store.index_built("default")
    # Filtered listings scan the records, as before: still right.
    assert ids(d.client.list_workflow_runs(status="error")) == [made["boom"]]
    assert ids(d.client.list_workflow_runs(waiting="approval")) == [made["approval"]]
    assert ids(d.client.list_workflow_runs(run_id_prefix=made["quick"][:6])) == [made["quick"]]

    assert d.client.reindex_runs() == 3
    assert store.index_built("default")
    assert disagreements(store, "default") == []
    assert ids(d.client.list_workflow_runs(waiting="approval")) == [made["approval"]]
    d.client.signal_workflow_run(made["approval"], "approval", None)
    d.client.wait_for_workflow_run(made["approval"], timeout=TIMEOUT)
    assert ids(d.client.list_workflow_runs(waiting=True)) == []
    assert disagreements(store, "default") == []


# -- a Redis restart from its AOF -----------------------------------------------------------


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis-data", port=free_port(), appendfsync="always")
    server.start()
    yield server
    server.stop()


def test_indexes_agree_with_the_records_after_a_restart_from_the_aof(
    durable, private_redis: RedisServer, settings: Settings, tmp_path: Path
) -> None:
    """Redis is SIGKILLed while runs start, wait and settle by the dozen; a
    server started from the AOF as it was then (a copy, that nothing writes
    to) holds indexes equal to its records, and so does the restarted one
    once the runs are done."""
    d = durable(ALL, redis_url=private_redis.url, broker_url=None)
    started = [d.client.start_workflow(name) for name in ("quick", "boom", "approval") * 8]
    poll(
        lambda: len(d.client.list_workflow_runs(status="completed", limit=50).runs) >= 3,
        within=2 * TIMEOUT,
        what="some runs to settle",
    )
    private_redis.kill()
    copy = tmp_path / "copy"
    copy.mkdir()
    shutil.copytree(private_redis.data_dir / "appendonlydir", copy / "appendonlydir")
    with RedisServer(copy, port=free_port(), appendfsync="always") as frozen:
        store = Engine(ALL, d.settings.model_copy(update={"redis_url": frozen.url})).store
        assert store.client.zcard(store.keys.namespace("default").runs) > 0
        assert disagreements(store, "default") == []
    private_redis.start()
    for run_id in started:
        poll(
            lambda r=run_id: (
                d.client.get_workflow_run(r).status in ("completed", "error") or waiting_for(d, r) == "approval"
            ),
            within=4 * TIMEOUT,
            what="every run to settle or wait once Redis is back",
        )
    assert disagreements(d.engine.store, "default") == []
    assert len(ids(d.client.list_workflow_runs(waiting="approval"))) == 8


# -- the command line and the web view ----------------------------------------------------------


def test_runs_list_waiting_prefix_since_and_runs_reindex_on_the_command_line(durable) -> None:
    from tests.support.apps.waits import await_signal, nap
    from tests.support.cli import cli

    app = "tests.support.apps.waits:make_engine"
    d = durable([await_signal, nap])
    go = [d.client.start_workflow("await-signal") for _ in range(2)]
    sleeping = d.client.start_workflow("nap", args={"seconds": 3600})
    for run_id in go:
        poll(lambda r=run_id: waiting_for(d, r) == "go", within=RUN_BOUND, what="the run to wait for go")
    poll(lambda: waiting_for(d, sleeping) == "", within=RUN_BOUND, what="the nap's timer")

    def listed(*options: str) -> list[str]:
        result = cli(d.settings, "runs", "list", "--app", app, *options, "--json")
        assert result.exit_code == 0, result.output
        return [run["run_id"] for run in json.loads(result.stdout)["runs"]]

    assert set(listed("--waiting")) == {*go, sleeping}
    assert listed("--waiting", "go") == go[::-1]
    assert listed("--waiting", "go", "--limit", "1") == [go[1]]
    assert listed("--prefix", sleeping[:10]) == [sleeping]
    assert listed("--since", "2000-01-01T00:00:00Z", "--until", "2000-01-02T00:00:00+00:00") == []
    assert set(listed("--since", "2000-01-01T00:00:00Z")) == {*go, sleeping}
    for options, message in [
        (["--since", "yesterday"], "ISO 8601"),
        (["--until", "2024-01-01T00:00:00"], "time zone"),
        (["--prefix", "XYZ"], "run_id_prefix"),
    ]:
        result = cli(d.settings, "runs", "list", "--app", app, *options)
        assert result.exit_code != 0 and message in result.stderr, result.output
    reindexed = cli(d.settings, "runs", "reindex", "--app", app, "--json")
    assert reindexed.exit_code == 0, reindexed.output
    assert json.loads(reindexed.stdout) == {"runs": 3}
    assert disagreements(d.engine.store, "default") == []


def test_every_script_that_can_change_a_status_or_a_wait_is_followed_by_its_index_sync() -> None:
    """A script that writes a status or the waiting summary (through the
    prelude's helpers) and is not in INDEXED_SCRIPTS would leave the indexes
    behind its record. call.lua and call_done.lua only wake a task call's
    wait, which has no place in the summary, and call_done's activation finds
    the run running already."""
    from importlib import resources

    from celery_durable.broker.ops import INDEXED_SCRIPTS, SCRIPT_NAMES

    helpers = re.compile(
        r"\b(set_status|set_waiting|refresh_waiting|summarize_child_wait|end_child_wait|tokens_clear|wake_waits"
        r"|activate_run)\("
    )
    folder = resources.files("celery_durable.broker") / "lua"
    changing = {name for name in SCRIPT_NAMES if helpers.search((folder / f"{name}.lua").read_text(encoding="utf-8"))}
    assert changing - {"call", "call_done"} == set(INDEXED_SCRIPTS)
    prelude = (folder / "_prelude.lua").read_text(encoding="utf-8")
    assert prelude.count("redis.call('HSET', run_key, 'waiting'") == 1  # set_waiting's own
    status_writes = [
        name
        for name in ("_prelude", *SCRIPT_NAMES)
        for _ in re.finditer(r"'HSET', [^,]+, 'status'", (folder / f"{name}.lua").read_text(encoding="utf-8"))
    ]
    assert status_writes == ["_prelude"]  # set_status's own
