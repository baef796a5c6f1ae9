#!/bin/sh
# Debian's redis-server for the fleet tests (tests/server/fleet: a real Redis as the shared job store; each test
# starts its own on a free port). Idempotent: does nothing when redis-server is already on PATH.
set -eu
if command -v redis-server >/dev/null 2>&1; then
    echo "redis-server already installed: $(redis-server --version)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install-redis: need root (or sudo) to apt-get install redis-server" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends redis-server
# the package starts a system service on some systems; the tests start their own servers and need none
$SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true
redis-server --version
