"""The client side: what starts, reads, steers and resumes runs from outside a
worker. The web view and the CLI build on it and the public API only."""

from celery_durable.client.async_client import AsyncClient
from celery_durable.client.client import Client

__all__ = ["AsyncClient", "Client"]
