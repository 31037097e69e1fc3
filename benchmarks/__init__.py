"""celery-durable measured against plain Celery, on the same Redis and workers.

``python -m benchmarks`` runs every case and writes ``RESULTS.md`` and
``results.json``; ``--quick`` is the tiny version CI runs as a smoke test.
"""
