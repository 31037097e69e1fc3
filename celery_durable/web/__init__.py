"""The web view of runs: ``celery-durable web``, or ``create_app`` in your own ASGI server.

Needs the ``web`` extra (``pip install 'celery-durable[web]'``); nothing
outside this package imports it, so workers and plain clients never load an
HTTP stack.

Modules, one concern each: ``app`` assembles the Starlette application;
``pages``, ``forms``, ``api`` and ``streams`` are its routes (HTML pages,
the actions' form POSTs, the JSON API, server-sent events); ``actions`` the
operator's actions both forms and API call; ``hub`` shares one Redis watch
among all open pages; ``security`` (who may connect) and ``session`` (CSRF
and notices) guard it; ``present`` formats values for templates;
``server`` runs it under uvicorn.
"""

from celery_durable.local.exposure import ExposureError, is_loopback
from celery_durable.web.app import create_app
from celery_durable.web.security import AUTH_ENV, Credential, check_exposure, served_hosts
from celery_durable.web.server import build_server

__all__ = [
    "AUTH_ENV",
    "Credential",
    "ExposureError",
    "build_server",
    "check_exposure",
    "create_app",
    "is_loopback",
    "served_hosts",
]
