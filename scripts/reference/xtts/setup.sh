#!/usr/bin/env bash
# Build the XTTS v2 reference environment (coqui-tts 0.28.0, the authors' package on PyPI) and write the goldens
# the xtts tests compare with.
#
#   scripts/reference/xtts/setup.sh [VENV=/work/ref-venvs/xtts] [WORK=/work/ref-venvs/xtts_work]
#
# coqui-tts accepts this tree's torch, transformers and numpy, but imports torchaudio (no build for this torch;
# 2.11's pure-PyTorch MelSpectrogram and resample run on it) and refuses to import without torchcodec (it only
# checks that the package is there: XTTS reads no file through it here). The venv sees the project's own
# packages (a .pth onto the project's .venv) and installs coqui-tts with its other dependencies under a
# constraint that keeps the project's torch, numpy and transformers; torchaudio and torchcodec without their
# dependencies. Nothing is installed into the project's .venv. The release's sentence splitting imports spaCy
# (spacy[ja]), which it does not declare: the venv takes the project's own (pyproject.toml pins it).
# Writes WORK/tiny (as `python -m omnistage.testing.tiny xtts` builds it) and tests/models/xtts/golden/ (the
# model's goldens by run_reference.py, the text front end's by text_goldens.py, the sentence splitting's and
# speech through the text front end by frontend_goldens.py).
# A few minutes on 2 cores (most of it the install).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
VENV="${1:-/work/ref-venvs/xtts}"
WORK="${2:-/work/ref-venvs/xtts_work}"
export HF_HUB_OFFLINE=1 PIP_FIND_LINKS= PYTHONPATH="$REPO"

if [ ! -e "$VENV/.installed" ]; then
  python3 -m venv "$VENV"
  SITE="$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  "$REPO/.venv/bin/python" -c 'import site; print(site.getsitepackages()[0])' > "$SITE/project_venv.pth"
  PINS="$WORK/pins.txt"
  mkdir -p "$WORK"
  "$REPO/.venv/bin/python" -c 'import numpy, torch, transformers
print(f"torch=={torch.__version__}\nnumpy=={numpy.__version__}\ntransformers=={transformers.__version__}")' > "$PINS"
  PIP_CONSTRAINT="$PINS" "$VENV/bin/python" -m pip install -q coqui-tts==0.28.0
  PIP_CONSTRAINT= "$VENV/bin/python" -m pip install -q --no-deps torchaudio==2.11.0 torchcodec==0.17.0
  touch "$VENV/.installed"
fi

rm -rf "$WORK/tiny"
"$VENV/bin/python" -m omnistage.testing.tiny xtts "$WORK/tiny"
"$VENV/bin/python" "$HERE/run_reference.py" "$WORK/tiny" "$REPO/tests/models/xtts/golden"
"$VENV/bin/python" "$HERE/text_goldens.py" "$WORK/tiny" "$REPO/tests/models/xtts/golden"
"$VENV/bin/python" "$HERE/frontend_goldens.py" "$WORK/tiny" "$REPO/tests/models/xtts/golden"
