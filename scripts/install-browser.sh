#!/bin/sh
# Headless Chromium + chromedriver for the playground's browser test (Debian/Ubuntu).
# Idempotent: does nothing when /usr/bin/chromium is already there.
set -eu
if [ -x /usr/bin/chromium ] && { [ -x /usr/bin/chromedriver ] || command -v chromedriver >/dev/null 2>&1; }; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install-browser: need root (or sudo) to apt-get install chromium" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# Debian names the packages chromium / chromium-driver.
$SUDO apt-get install -y -q --no-install-recommends chromium chromium-driver
/usr/bin/chromium --version
