"""``celery-durable web`` as a person runs it: refusals on one line, a real
server when all is well, and a CLI that works without the ``web`` extra."""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from celery_durable import Engine, Settings
from tests.support.apps.phased import phased
from tests.support.fleet import ROOT, settings_env
from tests.support.poll import RUN_BOUND, poll
from tests.support.readme import in_section

APP = "tests.support.apps.phased:make_engine"
WEB_MODULES = ("starlette", "uvicorn", "jinja2")
ENV_ASSIGNMENT = re.compile(r"^[A-Z][A-Z0-9_]*=")


def web_command(settings: Settings, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery_durable", "web", "--app", APP, *args],
        env={**settings_env(settings), **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error_line(done: subprocess.CompletedProcess[str], exit_code: int) -> str:
    assert done.returncode == exit_code, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_an_exposed_address_without_a_credential_refuses_to_start(settings: Settings, host: str) -> None:
    line = one_error_line(web_command(settings, "--host", host), 2)
    assert line == (
        f"error: refusing to serve on {host} without a credential: pass --auth user:password "
        "(or set CELERY_DURABLE_WEB_AUTH), or bind to 127.0.0.1"
    )


def test_a_malformed_credential_is_refused(settings: Settings) -> None:
    line = one_error_line(web_command(settings, env={"CELERY_DURABLE_WEB_AUTH": "nopassword"}), 2)
    assert "--auth / CELERY_DURABLE_WEB_AUTH: the credential must look like 'user:password'" in line


def test_without_the_web_extra_the_command_says_what_to_install(settings: Settings) -> None:
    # Imports of the extra's packages fail, as in an install without it.
    script = (
        "import sys\n"
        f"for name in {WEB_MODULES!r}: sys.modules[name] = None\n"
        "from celery_durable.cli import main\n"
        f"sys.argv = ['celery-durable', 'web', '--app', {APP!r}]\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    line = one_error_line(done, 2)
    assert line.startswith("error: the web view needs its extra: pip install 'celery-durable[web]'")


def test_the_package_and_its_cli_import_no_web_stack(settings: Settings) -> None:
    script = (
        "import sys, celery_durable, celery_durable.cli, celery_durable.cli.web\n"
        f"print([name for name in {WEB_MODULES!r} if name in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=settings_env(settings), cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError:
        return 0, ""


def test_the_command_serves_the_namespace_read_only(settings: Settings) -> None:
    client = Engine([phased], settings).client("team-a")
    run_id = client.start_workflow("phased", args={"items": []})  # no worker: a record is enough
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "celery_durable", "web", "--app", APP, "--port", str(port),
         "--namespace", "team-a", "--read-only"],
        env=settings_env(settings), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        poll(
            lambda: get(base + "/api/")[0] == 200 or process.poll() is not None,
            within=RUN_BOUND,
            what="the server to answer",
        )
        status, body = get(base + "/api/")
        assert status == 200, process.stdout.read() if process.stdout else ""
        assert json.loads(body)["namespace"] == "team-a" and json.loads(body)["read_only"] is True
        assert run_id in get(base + "/ns/team-a/")[1]
        assert get(base + "/ns/default/")[0] == 404
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=20)
    assert process.returncode in (0, 130)  # uvicorn from 0.29 re-raises the Ctrl-C it handled: 130


def test_the_readme_commands_install_the_extra_and_parse() -> None:
    (block,) = in_section("The web view")
    install, *commands = block.lines
    assert install == "pip install 'celery-durable[web]'"
    for line in commands:
        words = shlex.split(line)
        env: dict[str, str] = {}
        while words and ENV_ASSIGNMENT.match(words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        assert words[:2] == ["celery-durable", "web"], line
        # The real parser, with --help appended: an unknown option would be refused before the help.
        done = subprocess.run(
            [sys.executable, "-m", "celery_durable", *words[1:], "--help"],
            env={**settings_env(Settings()), **env}, cwd=ROOT, capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert "--read-only" in done.stdout
