#!/usr/bin/env bash
# Build the VoxCPM2 reference environment (OpenBMB's `voxcpm` 2.0.3 from PyPI) and write the goldens the voxcpm
# tests compare with.
#
#   scripts/reference/voxcpm/setup.sh [VENV=/work/ref-venvs/voxcpm] [WORK=/work/ref-venvs/voxcpm_work]
#
# voxcpm requires torch>=2.5 and transformers>=4.36 (the project's torch 2.13 and transformers 5.19 fit) and
# also torchaudio, torchcodec, gradio, funasr, modelscope, ... for its demo, training and denoiser. What its
# model code imports is torch, einops, pydantic, tqdm, transformers, safetensors, librosa (VoxCPM2 loads clips
# with it) and, through the package's __init__ (the VoxCPM1 model), torchaudio. So this venv sees the
# project's own packages (a .pth onto the project's .venv: the same torch and transformers) and adds
# voxcpm and torchaudio 2.11 without dependencies (torchaudio has no build for torch 2.13; it is only
# imported) and librosa with its own. Nothing is installed into the project's .venv. Writes WORK/tiny (the
# tiny folder, as `python -m omnistage.testing.tiny voxcpm` builds it) and tests/models/voxcpm/golden/.
# About a minute on 2 cores.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
VENV="${1:-/work/ref-venvs/voxcpm}"
WORK="${2:-/work/ref-venvs/voxcpm_work}"
export HF_HUB_OFFLINE=1 PIP_CONSTRAINT= PIP_FIND_LINKS=

if [ ! -e "$VENV/.installed" ]; then
  python3 -m venv "$VENV"
  SITE="$("$VENV/bin/python" -c 'import site; print(site.getsitepackages()[0])')"
  "$REPO/.venv/bin/python" -c 'import site; print(site.getsitepackages()[0])' > "$SITE/project_venv.pth"
  "$VENV/bin/python" -m pip install -q --no-deps voxcpm==2.0.3 torchaudio==2.11.0
  "$VENV/bin/python" -m pip install -q librosa==0.11.0
  touch "$VENV/.installed"
fi

rm -rf "$WORK/tiny"
"$VENV/bin/python" -m omnistage.testing.tiny voxcpm "$WORK/tiny"
OMP_NUM_THREADS=1 "$VENV/bin/python" "$HERE/run_reference.py" "$WORK/tiny" "$REPO/tests/models/voxcpm/golden"
