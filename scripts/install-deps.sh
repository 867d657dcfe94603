#!/usr/bin/env bash
# Installs what Sluice's tests need on a Debian machine: a real redis-server
# and promtool (Debian package prometheus) for the alert unit tests.
# Quiet and idempotent: it does nothing when both are present.
set -euo pipefail
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "missing: ${missing[*]}; run as root or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]} (Debian packages)..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
  # redis-server is required; promtool only runs the alert unit tests,
  # which skip with a message without it.
  apt-get install -y -qq --no-install-recommends redis-server >/dev/null
  echo "warning: prometheus (promtool) could not be installed; the alert unit tests will skip" >&2
fi
# The packages start system services; tests start their own processes on
# free ports (and only promtool is used from prometheus).
for svc in redis-server prometheus; do
  (systemctl stop "$svc" || service "$svc" stop || true) >/dev/null 2>&1
done
command -v redis-server
command -v promtool || true
