"""The client side: what starts, reads, steers and resumes runs from outside a worker.

The web view and the CLI build on this package and the public API only. Its
two classes load on first use, so that importing one read module (say
``client.history``) does not load the whole client with Celery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celery_durable.client.async_client import AsyncClient
    from celery_durable.client.client import Client

__all__ = ["AsyncClient", "Client"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from celery_durable.client.client import Client

        return Client
    if name == "AsyncClient":
        from celery_durable.client.async_client import AsyncClient

        return AsyncClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
