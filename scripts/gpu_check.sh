#!/usr/bin/env bash
# The one-shot GPU check (SD3 exactness vs diffusers, then step-level batching), run once on a lent GPU machine from the repository root:
#
#   bash scripts/gpu_check.sh [extra benchmarks/gpu_check.py flags]      (device tool: carry [".whl"], $OUT set)
#
# Installs the carried wheels (.whl/, git-ignored) into /tmp/site, runs omnistage from this checkout
# (PYTHONPATH, never pip-installed: its pyproject pins another torch) and writes gpu_check.{json,md},
# gpu_diffusion_batching.{json,md}, gpu_check.log, nvidia-smi.txt and pip.log under $OUT.
# The driver keeps to --budget-s (default 420 s); `timeout` below is only the backstop.
#
# `--suite evidence2` runs the real-size check instead (benchmarks/gpu_evidence.py: real-size random-weight
# Qwen-Image / FLUX.1-dev / Wan2.1-14B, mixed LoRA, step cache, offload; writes gpu_evidence.{json,md});
# `--parts` picks and orders its parts, `--tiny` is its CPU smoke path. Not yet run on a GPU.
#
# The GPU image (KINDS.md) has torch 2.11, transformers 5.17, huggingface-hub 1.33, accelerate, numpy,
# pillow, safetensors, pyyaml, tqdm; not diffusers, pydantic(-settings) or msgspec. The wheels, fetched
# here (their Requires-Dist checked by hand against that list; importlib_metadata, which diffusers names,
# is only imported on Python < 3.8; typing_extensions travels because pydantic needs >= 4.16):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
#     diffusers==0.42.1 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
#     typing_extensions==4.16.0 pydantic-settings==2.16.3 python-dotenv==1.2.4 msgspec==0.23.0
#
# Local use without wheels (the CPU smoke test): GPU_CHECK_SKIP_WHEELS=1 PYTHON=.venv/bin/python OUT=dir \
#   bash scripts/gpu_check.sh --device cpu --preset tiny ...
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/gpu_check_out}
SITE=${GPU_CHECK_SITE:-/tmp/site}
mkdir -p "$OUT"

if [ -z "${GPU_CHECK_SKIP_WHEELS:-}" ]; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "no wheels in $ROOT/.whl: carry .whl (see the pip download line at the top of this script)" >&2
    exit 2
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    >"$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log" >&2; exit 3; }
  export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
command -v nvidia-smi >/dev/null && nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1

timeout -k 10 "${GPU_CHECK_TIMEOUT:-460}" "$PY" benchmarks/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log"
