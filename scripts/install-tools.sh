#!/bin/sh
# What the tests need from the machine beside the venv and the browser (scripts/install-browser.sh), Debian/Ubuntu:
# - curl and jq (the vLLM-Omni compat test runs its client's curl | jq | base64 script), from apt;
# - the FFmpeg encoders the media tests make their inputs with and the server writes MP4s with. These are PyAV's:
#   its wheel (installed by pip with the venv) brings its own FFmpeg build, which is what the tests run, so they
#   are checked here, not installed from apt.
# Idempotent: installs nothing when everything is there. Usage: install-tools.sh [PYTHON] (default .venv/bin/python)
set -eu
PY="${1:-.venv/bin/python}"

missing=""
for tool in curl jq; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
if [ -n "$missing" ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        # -n: never prompt for a password (make install also runs on the way to make serve)
        command -v sudo >/dev/null 2>&1 || { echo "install-tools: need root (or sudo) to apt-get install$missing" >&2; exit 1; }
        SUDO="sudo -n"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    # shellcheck disable=SC2086 (one word per package)
    $SUDO apt-get install -y -q --no-install-recommends $missing
fi
echo "tools: $(curl --version | head -n 1); $(jq --version)"

"$PY" - <<'EOF'
import sys

import av

from omnistage.testing.requires import missing_encoders

# tests/e2e/media_matrix.py's inputs (MP3, Opus, AAC, H.265, VP9, lossless H.264) and the server's MP4 writer
ENCODERS = ("libmp3lame", "libopus", "aac", "libx265", "libvpx-vp9", "libx264rgb", "libx264")
if missing := missing_encoders(*ENCODERS):
    sys.exit(
        f"install-tools: PyAV {av.__version__}'s FFmpeg has no {', '.join(missing)} encoder (PyAV built from "
        "source against a system FFmpeg? pip install --force-reinstall --only-binary=av av)"
    )
print(f"encoders: PyAV {av.__version__} has {', '.join(ENCODERS)}")
EOF
