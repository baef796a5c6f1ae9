#!/usr/bin/env bash
# Build the OmniVoice reference environment (k2-fsa's `omnivoice` 0.2.1 from PyPI) and write the tiny
# checkpoint and the goldens the omnivoice tests compare with.
#
#   scripts/reference/omnivoice/setup.sh [VENV=/work/refvenv/omnivoice] [WORK=/work/refvenv/omnivoice_work]
#
# omnivoice pins torch>=2.4, transformers>=5.3 and torchaudio>=2.4; it imports torchaudio (resampling) and
# pydub (silence trimming) at module level, and its audio tokenizer is transformers' HiggsAudioV2TokenizerModel,
# which imports torchaudio too. torchaudio has no build for the project's torch, so this venv sees the
# project's own packages (a .pth onto the project's .venv: the same torch 2.13 and transformers) and adds,
# without dependencies, torchaudio 2.11 (only its pure-PyTorch resample runs), pydub and omnivoice itself
# (its other requirements, gradio/webdataset/tensorboardx, serve its demo and training, never imported here).
# Nothing is installed into the project's .venv. Writes tests/models/omnivoice/tiny/ (the checkpoint, made
# by the reference's own classes) and tests/models/omnivoice/golden/. About a minute on 2 cores.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
VENV="${1:-/work/refvenv/omnivoice}"
WORK="${2:-/work/refvenv/omnivoice_work}"
export HF_HUB_OFFLINE=1 PIP_CONSTRAINT= PIP_FIND_LINKS=

if [ ! -e "$VENV/.installed" ]; then
  python3 -m venv "$VENV"
  SITE="$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  "$REPO/.venv/bin/python" -c 'import site; print(site.getsitepackages()[0])' > "$SITE/project_venv.pth"
  "$VENV/bin/python" -m pip install -q --no-deps torchaudio==2.11.0 pydub==0.25.1 omnivoice==0.2.1
  touch "$VENV/.installed"
fi

mkdir -p "$WORK"
"$VENV/bin/python" "$HERE/make_tiny.py" "$REPO/tests/models/omnivoice/tiny"
"$VENV/bin/python" "$HERE/run_reference.py" "$REPO/tests/models/omnivoice/tiny" "$REPO/tests/models/omnivoice/golden"
