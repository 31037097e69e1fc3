"""Settings shared by workers, clients and the CLI."""

from celery_durable.config.settings import Settings

__all__ = ["Settings"]
