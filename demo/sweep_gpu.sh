#!/usr/bin/env bash
# Train several demo-model configurations side by side on one GPU, judge each on the selection
# prompts (demo/evaluate.py), and keep the best: how the shipped weights were made.
#
#   bash demo/sweep_gpu.sh           (device tool: carry [".whl"], $OUT set; see scripts/gpu_check.sh for the wheels)
#
# Every configuration gets the same time budget (SWEEP_MINUTES); train_shapes.py records the step
# counts it reached, so the winner's `command` in training_info.json reproduces it without a budget.
# Writes under $OUT: results.tar.gz (each run's training log, evaluation lines and contact sheets),
# best.txt (the winner and its scores) and the winner's folder as best.tar.gz.part-* (the device
# tool brings back files of at most 16 MiB; `cat best.tar.gz.part-* | tar xz` joins them).
#
# Local plumbing check (toy sizes; SWEEP_EXTRA flags override the configurations'):
#   SWEEP_DEVICE=cpu SWEEP_SKIP_WHEELS=1 PYTHON=.venv/bin/python OUT=/tmp/sweep-out SWEEP_GUIDANCE=2 \
#   SWEEP_EXTRA="--images 64 --batch 4 --vae-batch 2 --width 32 --layers 1 --vae-steps 2 --dit-steps 3 \
#   --decoder-steps 2" bash demo/sweep_gpu.sh
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
OUT=${OUT:-$ROOT/sweep_out}
DEVICE=${SWEEP_DEVICE:-cuda}
MINUTES=${SWEEP_MINUTES:-6.5}
WORK=/tmp/sweep
mkdir -p "$OUT" "$WORK"

if [ -z "${SWEEP_SKIP_WHEELS:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log" >&2; exit 3; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
command -v nvidia-smi >/dev/null && nvidia-smi >"$WORK/nvidia-smi.txt" 2>&1

# name: flags (all at width 128, 6 blocks: 14 MB of transformer, under the 20 MB limit with the rest)
declare -A CONFIGS=(
  [p2]="--patch-size 2 --lr 5e-4 --dit-fg-weight 0 --vae-channels 8,16,32"
  [p2fg]="--patch-size 2 --lr 1e-3 --dit-fg-weight 4 --vae-channels 8,16,32"
  [p1fg]="--patch-size 1 --lr 5e-4 --dit-fg-weight 4 --vae-channels 8,16,32"
  [p1fg_vae]="--patch-size 1 --lr 5e-4 --dit-fg-weight 4 --vae-channels 16,32,32"  # the winner, shipped
)
COMMON="--width 128 --layers 6 --images 20000 --batch 256 --vae-batch 32 --vae-fraction 0.2 --decoder-fraction 0.1
        --threads 2 --device $DEVICE --minutes $MINUTES"

for name in "${!CONFIGS[@]}"; do
  (
    # shellcheck disable=SC2086
    "$PY" demo/train_shapes.py --out "$WORK/$name" $COMMON ${CONFIGS[$name]} ${SWEEP_EXTRA:-} >"$WORK/$name.train.log" 2>&1 &&
      "$PY" demo/evaluate.py "$WORK/$name" --device "$DEVICE" --threads 2 --guidance "${SWEEP_GUIDANCE:-1.5,2,3,4}" --steps 20 \
        --sheet "$WORK/$name.sheets" >"$WORK/$name.eval.jsonl" 2>"$WORK/$name.eval.log"
    echo "$name done: rc $?"
  ) &
done
wait

# the winner: best worst-of(shape, colour, position) over its guidance settings, then best mean
"$PY" - "$WORK" "${!CONFIGS[@]}" >"$OUT/best.txt" <<'EOF'
import json, sys
work, names = sys.argv[1], sys.argv[2:]
rows = []
for n in names:
    try:
        lines = [json.loads(x) for x in open(f"{work}/{n}.eval.jsonl") if x.strip()]
    except OSError:
        continue
    for r in lines:
        key = (min(r["shape"], r["colour"], r["position"]), (r["shape"] + r["colour"] + r["position"]) / 3)
        rows.append((key, n, r))
rows.sort(key=lambda t: t[0], reverse=True)
for key, n, r in rows:
    print(n, json.dumps(r))
print("BEST", rows[0][1] if rows else "none")
EOF
cat "$OUT/best.txt"
best=$(awk '/^BEST/ {print $2}' "$OUT/best.txt")
tar czf "$OUT/results.tar.gz" -C "$WORK" --exclude='*.safetensors' .
if [ -n "$best" ] && [ "$best" != none ]; then
  tar czf - -C "$WORK" "$best" | split -b 15M - "$OUT/best.tar.gz.part-"
fi
ls -la "$OUT"
