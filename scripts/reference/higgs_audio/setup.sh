#!/usr/bin/env bash
# Build the Higgs Audio v2 reference environment and write the goldens the higgs_audio tests compare with.
#
#   scripts/reference/higgs_audio/setup.sh [VENV=/work/refvenv/higgs_audio] [WORK=/work/refvenv/higgs_audio_work]
#
# transformers' HiggsAudioV2TokenizerModel imports torchaudio at module level (its encoder resamples to the
# semantic model's 16 kHz with torchaudio.functional.resample), and torchaudio has no build for the project's
# torch. The reference venv sees the project's own packages (a .pth onto the project's .venv: the same
# torch and transformers) and adds torchaudio 2.11 without dependencies: only its pure-PyTorch resample is
# used, which imports and runs on this torch. Nothing is installed into the project's .venv.
# Writes WORK/tiny (the tiny folder, as `python -m omnistage.testing.tiny higgs_audio` builds it) and
# tests/models/higgs_audio/golden/. Under a minute on 2 cores.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
VENV="${1:-/work/refvenv/higgs_audio}"
WORK="${2:-/work/refvenv/higgs_audio_work}"
export HF_HUB_OFFLINE=1 PIP_CONSTRAINT= PIP_FIND_LINKS=

if [ ! -e "$VENV/.installed" ]; then
  python3 -m venv "$VENV"
  SITE="$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  "$REPO/.venv/bin/python" -c 'import site; print(site.getsitepackages()[0])' > "$SITE/project_venv.pth"
  "$VENV/bin/python" -m pip install -q --no-deps torchaudio==2.11.0
  touch "$VENV/.installed"
fi

rm -rf "$WORK/tiny"
"$VENV/bin/python" -m omnistage.testing.tiny higgs_audio "$WORK/tiny"
"$VENV/bin/python" "$HERE/run_reference.py" "$WORK/tiny" "$REPO/tests/models/higgs_audio/golden"
