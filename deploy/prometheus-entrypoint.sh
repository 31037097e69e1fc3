#!/bin/sh
# Prometheus in the compose fleet (docker-compose.yml): puts the web view's
# credential (CELERY_DURABLE_WEB_AUTH, "user:password") in the two files the
# scrape of the web view's /metrics reads (prometheus.yml, job
# celery-durable-web), then runs Prometheus with the arguments given.
# Prometheus reads no variables in its config and no "user:password" pair,
# only files; these are owner-only, in a tmpfs (never on a volume).
# Without the variable Prometheus still scrapes every worker: only the web
# view's levels (runs waiting, throttles) are missing, and this says so.
set -eu
dir="${SCRAPE_AUTH_DIR:-/run/scrape-auth}"
auth="${CELERY_DURABLE_WEB_AUTH:-}"
umask 077
mkdir -p "$dir"
case "$auth" in
  ?*:?*) ;;
  *) echo "prometheus: CELERY_DURABLE_WEB_AUTH is not set to user:password: the web view's /metrics (runs waiting, throttles) is not scraped" >&2 ;;
esac
# As the web view splits it: the user up to the first colon, the password after.
printf '%s' "${auth%%:*}" > "$dir/web-username"
printf '%s' "${auth#*:}" > "$dir/web-password"
exec "${PROMETHEUS:-/bin/prometheus}" "$@"
