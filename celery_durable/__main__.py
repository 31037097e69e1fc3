"""``python -m celery_durable`` is the ``celery-durable`` command."""

from celery_durable.cli import main

main()
