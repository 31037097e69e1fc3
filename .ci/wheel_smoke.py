"""The path a container image takes: the wheel, no extras, a real run.

Run with the Python of a fresh virtualenv into which only the built wheel was
installed (``pip install dist/celery_durable-*.whl``). It starts a private
redis-server (from PATH), a ``celery-durable worker`` from that same venv, and
completes a run of a two-step workflow with a fan-out; then the same on
RabbitMQ as the broker when one answers on localhost:5672. Exits non-zero,
saying why, on any failure. Nothing here imports the repository's sources:
the working directory is a temporary one holding only the workflow module.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

WORKFLOW_MODULE = textwrap.dedent(
    """
    from celery_durable import Engine, workflow

    @workflow(name="smoke", description="Wheel smoke test", phases=[{"title": "Work"}])
    def smoke(ctx):
        ctx.phase("Work")
        first = ctx.step("first", lambda: 20)
        pair = ctx.parallel([lambda: ctx.step("a", lambda: 10), lambda: ctx.step("b", lambda: 12)])
        return first + sum(pair)

    engine = Engine(workflows=[smoke])
    """
)


def rabbitmq_answers() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5672), timeout=1):
            return True
    except OSError:
        return False


def run_once(workdir: Path, env: dict[str, str], label: str) -> None:
    bin_dir = Path(sys.executable).parent
    worker = subprocess.Popen(
        [str(bin_dir / "celery-durable"), "worker", "--app", "smoke_flow:engine", "-P", "threads", "-c", "4",
         "--loglevel", "WARNING", "--quiet"],
        cwd=workdir, env=env, start_new_session=True,
    )
    try:
        code = (
            "import sys; from smoke_flow import engine\n"
            "envelope = engine.client().run_workflow('smoke', timeout=60)\n"
            "print(envelope.status, envelope.result)\n"
            "sys.exit(0 if envelope.status == 'completed' and envelope.result == 42 else 1)\n"
        )
        result = subprocess.run([sys.executable, "-c", code], cwd=workdir, env=env, timeout=90)
        if result.returncode != 0:
            raise SystemExit(f"wheel smoke ({label}): the run did not complete with 42")
        help_out = subprocess.run([str(bin_dir / "celery-durable"), "flower", "--help"], env=env,
                                  capture_output=True, text=True, timeout=60)
        if help_out.returncode != 0:
            raise SystemExit(f"wheel smoke ({label}): `celery-durable flower --help` failed: {help_out.stderr}")
        print(f"wheel smoke ({label}): ok")
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(timeout=30)


def main() -> None:
    import importlib.util

    from celery_durable.local.redis_server import RedisServer

    # The extras stay extras: a plain install brings neither Flower nor the
    # OpenAI SDK, and its worker completes a run all the same.
    brought = [name for name in ("openai", "flower") if importlib.util.find_spec(name) is not None]
    if brought:
        sys.exit(f"wheel smoke: a plain install brought {brought}, which are extras")

    with tempfile.TemporaryDirectory() as tmp, RedisServer() as redis_server:
        workdir = Path(tmp)
        (workdir / "smoke_flow.py").write_text(WORKFLOW_MODULE)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_DURABLE_")}
        env["PYTHONPATH"] = str(workdir)
        env["CELERY_DURABLE_REDIS_URL"] = redis_server.url
        env["CELERY_DURABLE_KEY_PREFIX"] = f"smoke{int(time.time())}"
        run_once(workdir, env, "redis broker")
        if rabbitmq_answers():
            env["CELERY_DURABLE_BROKER_URL"] = "amqp://guest:guest@127.0.0.1:5672//"
            env["CELERY_DURABLE_KEY_PREFIX"] = f"smokeamqp{int(time.time())}"
            run_once(workdir, env, "rabbitmq broker")
        else:
            print("wheel smoke: no RabbitMQ on localhost:5672, the amqp run is skipped")


if __name__ == "__main__":
    main()
