"""Serving the web view with uvicorn: the address check first, then the server.

The check lives here and not in the CLI so that any caller that serves the
app this way gets it; an application that mounts ``create_app`` in its own
server takes the decision itself.
"""

from __future__ import annotations

from collections.abc import Iterable

import uvicorn

from celery_durable import Engine
from celery_durable.web.app import create_app
from celery_durable.web.security import Credential, check_exposure, served_hosts

GRACEFUL_SHUTDOWN_SECONDS = 3
"""Open event streams never end by themselves: on Ctrl-C, close them after this long."""


def build_server(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    namespace: str | None = None,
    read_only: bool = False,
    auth: Credential | None = None,
    flower_url: str | None = None,
    allowed_hosts: Iterable[str] = (),
    log_level: str = "info",
) -> uvicorn.Server:
    """A uvicorn server for the web view; ``ExposureError`` for a non-loopback host without ``auth``.

    It answers the ``Host`` names ``served_hosts(host, allowed_hosts)``
    gives: the loopback names or the bound name, and ``allowed_hosts``.
    """
    check_exposure(host, auth)
    app = create_app(
        engine,
        namespace=namespace,
        read_only=read_only,
        auth=auth,
        flower_url=flower_url,
        allowed_hosts=served_hosts(host, allowed_hosts),
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        server_header=False,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    return uvicorn.Server(config)

