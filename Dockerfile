# The celery-durable image: the package from its wheel with the `web`,
# `flower` and `openai` extras (the web view's Starlette, uvicorn and Jinja2,
# Flower, and the OpenAI runner's SDK on top of the workers' own
# dependencies), its CLI, and the examples. One image for workers, Flower and the web view.
# Your own image: start FROM this one and COPY your workflows' package in,
# then set CELERY_DURABLE_APP to its engine.
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY celery_durable ./celery_durable
RUN pip wheel --no-deps --wheel-dir /dist .

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY --from=wheel /dist /dist
RUN pip install "$(echo /dist/*.whl)[web,flower,openai]" && rm -rf /dist
COPY examples ./examples

# Celery refuses to be comfortable as root, and a worker needs no privileges.
RUN useradd --create-home --uid 10001 durable
USER durable

CMD ["celery-durable", "--help"]
