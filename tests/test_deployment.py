"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

The file is parsed as Compose would (YAML merge keys included); every command
a service runs must be a real ``celery-durable`` command that accepts its
options (``--help`` appended: Click rejects an unknown option before it
prints help); every variable it sets must be a real setting or a variable a
command reads; Redis must keep the journal (AOF, fsync always, noeviction);
workers must scale with ``--scale``; Flower must sit behind basic auth from
the environment, checked once before they start (never a restart loop);
Prometheus must scrape every worker's metrics port, and the web view's
``/metrics`` with its credential: a real ``celery-durable web`` serves the
Grafana panel's metric to that scrape.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from celery_durable import Settings
from celery_durable.cli import app
from tests.conftest import DurableFactory
from tests.support.apps.waits import await_signal
from tests.support.fleet import ROOT, settings_env
from tests.support.poll import RUN_BOUND, poll

COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus.yml"
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
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
        if name in ("redis", "prometheus", "credentials"):
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


def mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Each file a service mounts from the repository, by its path in the container."""
    return {volume.split(":")[1]: ROOT / volume.split(":")[0] for volume in service.get("volumes", [])}


def run_script(path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = ["sh", str(path), *args]
    return subprocess.run(command, env={"PATH": os.environ["PATH"], **env}, capture_output=True, text=True, timeout=30)


def test_without_a_credential_flower_and_the_web_view_stop_once_with_the_message() -> None:
    found = services()
    check = found["credentials"]
    assert check["restart"] == "no", "a failed check is not repeated"
    script = mounts(check)[argv(check)[-1]]
    assert argv(check)[0] == "sh" and script.exists()
    for name in ("flower", "web"):
        assert found[name]["depends_on"]["credentials"] == {"condition": "service_completed_successfully"}, name
        assert found[name]["depends_on"]["redis"] == {"condition": "service_healthy"}, name
    for name in (*WORKERS, "prometheus", "redis"):
        assert "credentials" not in found[name].get("depends_on", {}), f"{name} runs without the credentials"
    assert check["environment"] == {
        "FLOWER_BASIC_AUTH": "${FLOWER_BASIC_AUTH:-}",
        "CELERY_DURABLE_WEB_AUTH": "${CELERY_DURABLE_WEB_AUTH:-}",
    }
    none = run_script(script, {})
    assert none.returncode == 1 and len(none.stderr.splitlines()) == 1
    assert "set FLOWER_BASIC_AUTH CELERY_DURABLE_WEB_AUTH to user:password" in none.stderr
    one = run_script(script, {"FLOWER_BASIC_AUTH": "admin:s3cret", "CELERY_DURABLE_WEB_AUTH": "nopassword"})
    assert one.returncode == 1 and "set CELERY_DURABLE_WEB_AUTH to" in one.stderr and "FLOWER" not in one.stderr
    both = run_script(script, {"FLOWER_BASIC_AUTH": "admin:s3cret", "CELERY_DURABLE_WEB_AUTH": "ops:s3cret"})
    assert both.returncode == 0, both.stderr


def web_scrape() -> dict[str, Any]:
    config = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "celery-durable-web"]
    return dict(job)


def panel_metric() -> str:
    """The metric the dashboard's "Runs waiting now" panel queries."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    (panel,) = [p for p in dashboard["panels"] if str(p.get("title", "")).startswith("Runs waiting now")]
    (target,) = panel["targets"]
    found = re.search(r"\b(celery_durable_\w+)", target["expr"])
    assert found, target["expr"]
    return found[1]


def test_prometheus_scrapes_the_web_views_metrics_with_its_credential() -> None:
    found = services()
    job, web, prometheus = web_scrape(), found["web"], found["prometheus"]
    (target,) = [t for static in job["static_configs"] for t in static["targets"]]
    host, _, port = target.partition(":")
    command = argv(web)
    assert host == "web" and int(port) == int(command[command.index("--port") + 1])
    assert command[command.index("--allowed-host") + 1] == host, "the web view answers the Host Prometheus sends"
    assert job.get("metrics_path", "/metrics") == "/metrics" and job.get("scheme", "http") == "http"
    auth = job["basic_auth"]
    assert set(auth) == {"username_file", "password_file"}, "no credential written in the config"
    # The files are written, from the web view's own variable, by the entrypoint, in a tmpfs.
    assert prometheus["environment"]["CELERY_DURABLE_WEB_AUTH"] == "${CELERY_DURABLE_WEB_AUTH:-}"
    assert prometheus["entrypoint"][0] == "/bin/sh" and prometheus["entrypoint"][1] in mounts(prometheus)
    (tmpfs,) = prometheus["tmpfs"]
    assert all(os.path.dirname(path) == tmpfs for path in auth.values())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(url: str, host: str, auth: tuple[str, str] | None) -> tuple[int, str]:
    """A GET as Prometheus's scrape sends it: the target's Host, basic auth from the files."""
    request = urllib.request.Request(url, headers={"Host": host})
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""
    except OSError:
        return 0, ""


def test_a_real_web_view_serves_the_panels_metric_to_that_scrape(durable: DurableFactory, tmp_path: Path) -> None:
    job, prometheus = web_scrape(), services()["prometheus"]
    entrypoint = mounts(prometheus)[prometheus["entrypoint"][1]]
    credential = "ops:pa:ss word"  # a colon and a space in the password: split as the web view splits it
    # The entrypoint as the container runs it: its files in the test's directory, a stand-in for Prometheus.
    files = tmp_path / "scrape-auth"
    stand_in = tmp_path / "prometheus"
    stand_in.write_text('#!/bin/sh\necho "$@" > "$(dirname "$0")/args"\n', encoding="utf-8")
    stand_in.chmod(0o755)
    env = {"CELERY_DURABLE_WEB_AUTH": credential, "SCRAPE_AUTH_DIR": str(files), "PROMETHEUS": str(stand_in)}
    started = run_script(entrypoint, env, *map(str, prometheus["command"]))
    assert started.returncode == 0, started.stderr
    assert (tmp_path / "args").read_text().split() == [str(a) for a in prometheus["command"]]
    paths = {name: files / os.path.basename(path) for name, path in job["basic_auth"].items()}
    auth = (paths["username_file"].read_text(), paths["password_file"].read_text())
    assert auth == ("ops", "pa:ss word")
    assert all(path.stat().st_mode & 0o077 == 0 for path in paths.values()), "owner-only"

    fleet = durable([await_signal])
    run_id = fleet.client.start_workflow("await-signal")
    poll(
        lambda: fleet.client.get_workflow_run(run_id).snapshot.get("waiting_for"),
        within=RUN_BOUND,
        what="the run to wait",
    )
    port = free_port()
    target_host = job["static_configs"][0]["targets"][0]
    web = services()["web"]
    command = argv(web)
    process = subprocess.Popen(
        [sys.executable, "-m", "celery_durable", "web", "--app", "tests.support.apps.waits:engine",
         "--port", str(port), "--allowed-host", command[command.index("--allowed-host") + 1]],
        env={**settings_env(fleet.settings), "CELERY_DURABLE_WEB_AUTH": credential},
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}{job.get('metrics_path', '/metrics')}"
        poll(
            lambda: scrape(url, target_host, auth)[0] or process.poll() is not None,
            within=RUN_BOUND,
            what="the web view to answer",
        )
        assert scrape(url, target_host, None)[0] == 401, "the scrape needs the credential"
        assert scrape(url, target_host, ("ops", "wrong"))[0] == 401
        status, body = scrape(url, target_host, auth)
        assert status == 200, process.stdout.read() if process.stdout else ""
        metric = panel_metric()
        samples = {
            sample.labels["kind"]: sample.value
            for family in text_string_to_metric_families(body)
            for sample in family.samples
            if sample.name == metric and sample.labels.get("namespace") == "default"
        }
        assert samples.get("signal") == 1.0, samples
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=20)


def test_a_schedules_named_time_zone_resolves_on_an_image_with_no_time_zone_database() -> None:
    """A slim image may carry no /usr/share/zoneinfo: an empty PYTHONTZPATH is
    such a machine, and the zone comes from the tzdata dependency."""
    probe = "from celery_durable.schedules.calendar import zone; print(zone('Europe/Berlin'), zone('US/Central'))"
    env = {**os.environ, "PYTHONTZPATH": ""}
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.split() == ["Europe/Berlin", "US/Central"]
