"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

The file is parsed as Compose would (YAML merge keys included); every command
a service runs must be a real ``celery-durable`` command that accepts its
options (``--help`` appended: Click rejects an unknown option before it
prints help); every variable it sets must be a real setting or a variable a
command reads; Redis must keep the journal (AOF, fsync always, noeviction);
workers must scale with ``--scale``; Flower must sit behind basic auth from
the environment; Prometheus must scrape every worker's metrics port.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from celery_durable import Settings
from celery_durable.cli import app
from tests.fleet import ROOT

COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
WORKERS = ("coordinator", "steps", "agents")
_INTERPOLATION = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text(encoding="utf-8")))


def services() -> dict[str, dict[str, Any]]:
    return dict(compose()["services"])


def interpolate(value: str) -> str:
    """Compose's ``${VAR:-default}`` as it would resolve with VAR unset; ``${VAR:?}`` as a sample value."""

    def resolve(match: re.Match[str]) -> str:
        if match["op"] in (":-", "-"):
            return match["arg"]
        return "user:secret" if match["name"] == "FLOWER_BASIC_AUTH" else "x"

    return _INTERPOLATION.sub(resolve, value)


def argv(service: dict[str, Any]) -> list[str]:
    command = service["command"]
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def cli_envvars() -> set[str]:
    """Every variable an option of a ``celery-durable`` command reads."""
    names: set[str] = set()

    def walk(command: Any) -> None:
        # Duck-typed: recent Typer vendors its own copy of Click.
        for param in command.params:
            envvar = getattr(param, "envvar", None)
            if isinstance(envvar, str):
                names.add(envvar)
            elif envvar:
                names.update(envvar)
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    return names


def test_the_file_parses_with_the_services_of_a_fleet() -> None:
    found = services()
    assert {"redis", *WORKERS, "flower", "web"} <= set(found)
    assert "redis-data" in compose()["volumes"]


def test_redis_keeps_the_journal() -> None:
    redis = services()["redis"]
    command = argv(redis)
    assert command[0] == "redis-server"
    options = dict(zip(command[1::2], command[2::2], strict=False))
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "always"
    assert options["--maxmemory-policy"] == "noeviction"
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    assert "healthcheck" in redis


@pytest.mark.parametrize("name", [*WORKERS, "flower", "web"])
def test_every_command_is_a_real_command_that_accepts_its_options(name: str) -> None:
    command = argv(services()[name])
    assert command[0] == "celery-durable", command
    result = CliRunner().invoke(app, [*command[1:], "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


@pytest.mark.parametrize("name", WORKERS)
def test_each_worker_service_consumes_its_own_queue(name: str) -> None:
    command = argv(services()[name])
    queues = command[command.index("--queues") + 1].split(",")
    defaults = Settings(redis_url="redis://x:6379/0")
    assert queues == [getattr(defaults, f"{name}_queue")]


def test_every_variable_is_a_setting_or_read_by_a_command() -> None:
    known_settings = {f"CELERY_DURABLE_{field.upper()}" for field in Settings.model_fields}
    known = known_settings | cli_envvars()
    for name, service in services().items():
        if name in ("redis", "prometheus"):
            continue
        env = {key: interpolate(str(value)) for key, value in service["environment"].items()}
        assert set(env) <= known, (name, sorted(set(env) - known))
        assert env["CELERY_DURABLE_REDIS_URL"] == "redis://redis:6379/0"
        # The values are valid, too: Settings accepts them as the containers' environment would give them.
        values = {key.removeprefix("CELERY_DURABLE_").lower(): v for key, v in env.items() if key in known_settings}
        Settings(**values)
        assert ":" in env["CELERY_DURABLE_APP"]


def test_prometheus_scrapes_every_worker_replica_on_its_metrics_port() -> None:
    prometheus = services()["prometheus"]
    mounted = {volume.split(":")[1]: volume.split(":")[0] for volume in prometheus["volumes"]}
    config_path = ROOT / mounted["/etc/prometheus/prometheus.yml"]
    assert config_path == PROMETHEUS and config_path.exists()
    assert "--config.file=/etc/prometheus/prometheus.yml" in argv(prometheus)
    assert all(port.startswith("127.0.0.1:") for port in prometheus["ports"]), "not exposed beyond the host"
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    targets: dict[str, int] = {}
    for job in config["scrape_configs"]:
        for discovery in job.get("dns_sd_configs", []):
            targets.update({name: int(discovery["port"]) for name in discovery["names"]})
    for name in WORKERS:
        command = argv(services()[name])
        # The port each worker serves is the one Prometheus scrapes, for every replica of the service (by its name).
        assert targets[name] == int(command[command.index("--metrics-port") + 1]), name


def test_workers_scale() -> None:
    for name in WORKERS:
        service = services()[name]
        assert "container_name" not in service, name
        assert "ports" not in service, name
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        hostname = argv(service)[argv(service).index("--hostname") + 1]
        assert hostname.endswith("@%h"), "node names must differ between replicas"


@pytest.mark.parametrize(("name", "variable"), [("flower", "FLOWER_BASIC_AUTH"), ("web", "CELERY_DURABLE_WEB_AUTH")])
def test_flower_and_the_web_view_are_behind_a_credential_from_the_environment(name: str, variable: str) -> None:
    service = services()[name]
    auth = service["environment"][variable]
    # Never a default password, and never ${VAR:?...}: that fails every compose command
    # (even `logs`) when unset. Unset, it is empty, and the service's own command refuses.
    assert auth == f"${{{variable}:-}}", auth
    assert variable in cli_envvars()
    command = argv(service)
    assert "--basic-auth" not in command and "--auth" not in command, "a password in a process list"
    app_env = interpolate(str(service["environment"]["CELERY_DURABLE_APP"]))
    refused = CliRunner().invoke(app, command[1:], env={variable: "", "CELERY_DURABLE_APP": app_env})
    assert refused.exit_code == 2, refused.output
    assert "refusing to serve on 0.0.0.0 without a credential" in refused.output


def test_no_compose_command_needs_a_variable_set() -> None:
    """``${VAR:?}`` anywhere fails every command (``docker compose logs`` too) when VAR is unset."""
    text = COMPOSE.read_text(encoding="utf-8")
    assert not [match[0] for match in _INTERPOLATION.finditer(text) if match["op"] in (":?", "?")]


def test_the_dockerfile_builds_from_files_that_exist_and_runs_the_cli() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    for line in dockerfile.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    # The image installs the wheel with the web, flower and openai extras:
    # workers (the OpenAI runner included), Flower and the web view run on it.
    assert "pip wheel --no-deps" in dockerfile
    assert re.search(r'^RUN pip install "\$\(echo /dist/\*\.whl\)\[web,flower,openai\]"', dockerfile, re.MULTILINE)
    assert re.search(r"^USER (?!root)\w+", dockerfile, re.MULTILINE), "workers do not run as root"
    ignored = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert {".git", ".venv", ".celery-durable"} <= set(ignored)
    # Compose builds the image every worker service, Flower and the web view run.
    assert all(services()[name]["build"] == "." for name in [*WORKERS, "flower", "web"])


def test_the_examples_module_the_fleet_runs_by_default_exists() -> None:
    default = interpolate(str(services()["coordinator"]["environment"]["CELERY_DURABLE_APP"]))
    module = default.partition(":")[0]
    assert Path(ROOT, *module.split(".")).with_suffix(".py").exists(), default
