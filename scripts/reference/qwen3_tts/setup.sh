#!/usr/bin/env bash
# Build the Qwen3-TTS reference environment (qwen-tts 0.1.1, its transformers 4.57.3 pin, torch 2.9.1 on
# CPU) in its own venv outside the repo, then the tiny checkpoints and the goldens the tests compare with.
#
#   scripts/reference/qwen3_tts/setup.sh [VENV=/work/refvenv/qwen3_tts] [WORK=/work/refvenv/qwen3_tts_work]
#
# Writes WORK/tiny/{custom_voice,voice_design,base,custom_voice_0b6}/ and tests/models/qwen3_tts/golden/*.npz (+ the tiny
# checkpoints the tests load, see make_tiny.py).  About 5 min on 2 cores; the venv is several GB.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
VENV="${1:-/work/refvenv/qwen3_tts}"
WORK="${2:-/work/refvenv/qwen3_tts_work}"
export HF_HUB_OFFLINE=1 PIP_CONSTRAINT= PIP_FIND_LINKS=

if [ ! -e "$VENV/.installed" ]; then
  python3 -m venv "$VENV"
  # PyPI's torch 2.9.1 (CUDA build; runs on the CPU). The machine's pip constraint caps torch for the
  # project's venv only: PIP_CONSTRAINT= lifts it here.
  "$VENV/bin/python" -m pip install -q torch==2.9.1 torchvision==0.24.1 'torchaudio==2.9.*'
  "$VENV/bin/python" -m pip install -q qwen-tts==0.1.1 soundfile
  touch "$VENV/.installed"
fi

"$VENV/bin/python" "$HERE/make_tiny.py" "$WORK/tiny"
"$VENV/bin/python" "$HERE/run_reference.py" "$WORK/tiny" "$REPO/tests/models/qwen3_tts/golden"
