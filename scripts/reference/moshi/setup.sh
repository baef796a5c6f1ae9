#!/usr/bin/env bash
# Build the Moshi reference environment (the authors' moshi 0.2.13, which pins torch<2.10 and numpy<2.3, so it
# cannot live in the project's venv) in its own venv outside the repo, then the tiny checkpoint and the goldens
# the tests compare with.
#
#   scripts/reference/moshi/setup.sh [VENV=/work/ref-venvs/moshi]
#
# Writes tests/models/moshi/tiny/ (the authors' checkpoint format, committed: the tests load what the reference
# loaded) and tests/models/moshi/golden/ (*.npz, sampled.json). About a minute once the venv exists.
# The venv also runs moshi.server for benchmarks/duplex.py (serve_reference.py), and lends its packages to
# PersonaPlex's reference venv (setup_personaplex.sh).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
VENV="${1:-/work/ref-venvs/moshi}"
export HF_HUB_OFFLINE=1 PIP_CONSTRAINT= PIP_FIND_LINKS=

if [ ! -e "$VENV/.installed" ]; then
  python3 -m venv "$VENV"
  # PyPI's torch 2.9.1 (CUDA build; runs on the CPU). Its CUDA libraries are needed even on the CPU: torch
  # preloads them at import (a --no-deps install fails with "libcublas.so.* not found"); the venv is ~7 GB.
  "$VENV/bin/python" -m pip install -q torch==2.9.1
  # moshi's runtime imports; bitsandbytes (quantisation) and sounddevice (microphone) are not used here.
  "$VENV/bin/python" -m pip install -q --no-deps moshi==0.2.13
  "$VENV/bin/python" -m pip install -q 'numpy<2.3' 'safetensors<0.8' 'huggingface-hub<1.0' 'einops<0.9' \
    'sentencepiece<0.3' 'sphn>=0.2,<0.3' 'aiohttp<3.12' tqdm
  touch "$VENV/.installed"
fi

"$VENV/bin/python" "$HERE/make_tiny.py" "$REPO/tests/models/moshi/tiny"
"$VENV/bin/python" "$HERE/run_reference.py" "$REPO/tests/models/moshi/tiny" "$REPO/tests/models/moshi/golden"
