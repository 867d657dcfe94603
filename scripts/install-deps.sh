#!/usr/bin/env bash
# Installs what Sluice's tests need on a Debian machine: a real redis-server.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "redis-server is missing; run as root or: sudo apt-get install -y redis-server" >&2
  exit 1
fi
echo "installing redis-server (Debian package)..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq redis-server >/dev/null
# The package starts a system instance; tests start their own on free ports.
(systemctl stop redis-server || service redis-server stop || true) >/dev/null 2>&1
command -v redis-server
