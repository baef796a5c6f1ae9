#!/usr/bin/env bash
# Build NVIDIA PersonaPlex's reference environment and write the persona golden and the tiny voice preset.
#
#   scripts/reference/moshi/setup_personaplex.sh [SRC] [VENV=/work/ref-venvs/personaplex]
#
# PersonaPlex is not on PyPI (checked 2026-12-08: personaplex, nvidia-personaplex, moshi-personaplex); its code is
# a fork of the authors' moshi (package "moshi-personaplex" 0.1.0, in the moshi/ folder of
# github.com/NVIDIA/personaplex). SRC is a checkout of that repository; without it the pinned commit is cloned.
# The fork pins torch<2.5 and numpy<2.2; it is installed without its dependencies into a venv that reuses the
# moshi reference venv's packages (torch 2.9.1, numpy 2.2.6, sentencepiece, safetensors; built by setup.sh,
# which must run first) through a .pth file, so its own "moshi" shadows the authors' 0.2.13. The code used here
# (LMModel, LMGen with its prompt phases) runs on them unchanged.
#
# Writes tests/models/moshi/tiny/voices/tiny.pt and tests/models/moshi/golden/persona.{npz,json} (run_persona.py).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
COMMIT=3428dfd95309a7f3c84fd93259ded0f810d1ff91
SRC="${1:-}"
VENV="${2:-/work/ref-venvs/personaplex}"
MOSHI_VENV=/work/ref-venvs/moshi
export HF_HUB_OFFLINE=1 PIP_CONSTRAINT= PIP_FIND_LINKS=

if [ ! -e "$VENV/.installed" ]; then
  [ -e "$MOSHI_VENV/.installed" ] || { echo "run scripts/reference/moshi/setup.sh first" >&2; exit 1; }
  if [ -z "$SRC" ]; then
    SRC="$(mktemp -d)/personaplex"
    git clone -q https://github.com/NVIDIA/personaplex "$SRC"
    git -C "$SRC" checkout -q "$COMMIT"
  fi
  python3 -m venv "$VENV"
  SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  "$MOSHI_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$SITE/zz_moshi_ref.pth"
  "$VENV/bin/python" -m pip install -q --no-deps "$SRC/moshi"
  touch "$VENV/.installed"
fi

"$VENV/bin/python" "$HERE/run_persona.py" "$REPO/tests/models/moshi/tiny" "$REPO/tests/models/moshi/golden"
