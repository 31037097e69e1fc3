#!/bin/sh
# Runs once before Flower and the web view (docker-compose.yml, service
# `credentials`). Both are exposed, so each refuses to start without its
# credential; under `restart: unless-stopped` that refusal would repeat
# forever. Checked here, once, a missing credential stops them before they
# start: one message, nothing restarted, and every other service runs.
set -eu
missing=""
check() {
  case "$2" in
    ?*:?*) ;;
    *) missing="$missing $1" ;;
  esac
}
check FLOWER_BASIC_AUTH "${FLOWER_BASIC_AUTH:-}"
check CELERY_DURABLE_WEB_AUTH "${CELERY_DURABLE_WEB_AUTH:-}"
if [ -n "$missing" ]; then
  echo "credentials: set${missing} to user:password (export it, or put it in .env) and run docker compose up -d again: Flower and the web view are exposed and do not start without it" >&2
  exit 1
fi
echo "credentials: FLOWER_BASIC_AUTH and CELERY_DURABLE_WEB_AUTH are set"
