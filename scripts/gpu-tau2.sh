#!/usr/bin/env bash
# τ²-bench retail with real models on ONE GPU, in one command:
#
#   scripts/gpu-tau2.sh --tau2 PATH/TO/tau2-bench [--out DIR]
#
# Starts two SGLang servers on the one GPU (memory split between them: docs/BENCHMARKS.md), the
# weak model with hidden states on (LEASH reads them), waits until both answer, then runs the
# benchmark over tau2-bench's held-out test split in each mode — weak-only, strong-only, spec,
# spec+leash — one mode at a time, so each has the GPU to itself, every task a conversation with
# an LLM user simulator (the strong model unless USER_URL/USER_MODEL), and writes the SpecAgent
# table (pass@1; strong decode, wall and HBM as ratios to strong-only) to DIR/table.md. Wall is
# measured; HBM is modelled by COST_MODEL from the endpoints' own token counts. The servers are
# stopped when the script ends, however it ends.
#
# The test split is not in this repository (data/tau2-retail holds the 74 train tasks only):
# `git clone https://github.com/sierra-research/tau2-bench` and pass it as --tau2 (or name the
# retail folder itself with --data DIR, or run SPLIT=train).
#
# Environment (defaults in brackets):
#   WEAK_MODEL [Qwen/Qwen3-4B]  STRONG_MODEL [Qwen/Qwen3-32B]   what SGLang serves (BF16)
#   WEAK_PORT [30000]  STRONG_PORT [30001]
#   WEAK_MEM_FRACTION [0.25]  STRONG_MEM_FRACTION [0.95]   SGLang --mem-fraction-static, of the
#                                memory free when each server starts (the weak one starts first)
#   WEAK_KV_TOKENS [131072]  STRONG_KV_TOKENS [163840]      SGLang --max-total-tokens: the KV pools
#   SGLANG_PYTHON [python3]      the interpreter that has sglang;  SGLANG_ARGS  extra flags for both
#   WAIT_S [1800]                how long a server may take to answer (weights load first)
#   WEAK_URL, STRONG_URL         both set: start nothing, use these OpenAI-compatible base URLs
#   USER_URL, USER_MODEL         the user simulator (default: the strong endpoint's model)
#   SPLIT [test]  TRIALS [1]  LIMIT [all]  MODES [weak-only strong-only spec spec+leash]
#   CONCURRENCY [1]              conversations at a time per mode (the runner's run.concurrency);
#                                spec+leash always runs one at a time (its banks fill in task order)
#   PARAMS                       a --params TOML for the runner instead of the one made from CONCURRENCY
#   LEASH_DIM [2560]             the weak model's hidden size (Qwen3-4B: 2560)
#   PROVIDER [sglang]  COST_MODEL [bench/cost_one_gpu.toml, or none]  MAX_TURNS  MAX_TOKENS
#   PYTHON [.venv/bin/python]    the benchmark's interpreter (the repository's .venv)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="tau2-gpu-results"
TAU2=""
DATA="${DATA:-}"

usage() { sed -n '2,4p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,3\}//' >&2; exit 2; }
while (($#)); do
  case "$1" in
    --tau2) TAU2="$2"; shift 2 ;;
    --data) DATA="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-tau2: unknown argument $1" >&2; usage ;;
  esac
done

WEAK_MODEL="${WEAK_MODEL:-Qwen/Qwen3-4B}"
STRONG_MODEL="${STRONG_MODEL:-Qwen/Qwen3-32B}"
WEAK_PORT="${WEAK_PORT:-30000}"
STRONG_PORT="${STRONG_PORT:-30001}"
WEAK_MEM_FRACTION="${WEAK_MEM_FRACTION:-0.25}"
STRONG_MEM_FRACTION="${STRONG_MEM_FRACTION:-0.95}"
WEAK_KV_TOKENS="${WEAK_KV_TOKENS:-131072}"
STRONG_KV_TOKENS="${STRONG_KV_TOKENS:-163840}"
SGLANG_PYTHON="${SGLANG_PYTHON:-python3}"
WAIT_S="${WAIT_S:-1800}"
SPLIT="${SPLIT:-test}"
TRIALS="${TRIALS:-1}"
MODES="${MODES:-weak-only strong-only spec spec+leash}"
CONCURRENCY="${CONCURRENCY:-1}"
LEASH_DIM="${LEASH_DIM:-2560}"
PROVIDER="${PROVIDER:-sglang}"
COST_MODEL="${COST_MODEL:-$REPO/bench/cost_one_gpu.toml}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"

fail() { echo "gpu-tau2: $*" >&2; exit 1; }

# The data, checked before any server starts: loading 70 GB of weights to learn this is slow.
if [[ -z "$DATA" && -n "$TAU2" ]]; then DATA="$TAU2/data/tau2/domains/retail"; fi
if [[ -z "$DATA" ]]; then DATA="$REPO/data/tau2-retail"; fi
[[ -f "$DATA/db.json" ]] || fail "no db.json in $DATA: pass --tau2 PATH/TO/tau2-bench (a checkout) or --data RETAIL_DIR"
if [[ "$SPLIT" != "train" && "$SPLIT" != "all" && ! -f "$DATA/split_tasks.json" ]]; then
  fail "$DATA holds no $SPLIT split (no split_tasks.json; the repository's data/tau2-retail has the 74 train" \
    "tasks only): git clone https://github.com/sierra-research/tau2-bench and pass --tau2 PATH, or SPLIT=train"
fi
[[ -x "$PYTHON" ]] || fail "no interpreter at $PYTHON: create the repository's .venv (pip install -e .) or set PYTHON"
if [[ -n "${WEAK_URL:-}" && -z "${STRONG_URL:-}" || -z "${WEAK_URL:-}" && -n "${STRONG_URL:-}" ]]; then
  fail "set both WEAK_URL and STRONG_URL (to use running servers), or neither (to start SGLang)"
fi

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SERVERS=()  # process groups this script started, stopped on exit

stop_servers() {
  local group
  for group in "${SERVERS[@]}"; do
    kill -TERM -- "-$group" 2>/dev/null || true
  done
  for group in "${SERVERS[@]}"; do
    for _ in $(seq 1 30); do kill -0 -- "-$group" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$group" 2>/dev/null || true
  done
}
trap stop_servers EXIT

# wait_ready NAME URL [PID]: until URL answers 200, the server's process dies, or WAIT_S passes.
wait_ready() {
  local name="$1" url="$2" pid="${3:-}" deadline=$((SECONDS + WAIT_S))
  echo "gpu-tau2: waiting for the $name model at $url" >&2
  local auth=()
  # A keyed endpoint (given as WEAK_URL/STRONG_URL) answers /models only with the key the runner sends.
  [[ -n "${OPENAI_API_KEY:-}" ]] && auth=(-H "Authorization: Bearer $OPENAI_API_KEY")
  until curl -sf -m 10 -o /dev/null "${auth[@]}" "$url"; do
    if [[ -n "$pid" ]] && ! kill -0 "$pid" 2>/dev/null; then
      tail -n 30 "$OUT/sglang-$name.log" >&2 || true
      fail "the $name server exited before it answered (log: $OUT/sglang-$name.log)"
    fi
    ((SECONDS < deadline)) || fail "the $name model did not answer at $url within ${WAIT_S}s"
    sleep 2
  done
}

# start_server NAME MODEL PORT FRACTION KV_TOKENS [FLAG...]: SGLang in its own process group.
start_server() {
  local name="$1" model="$2" port="$3" fraction="$4" tokens="$5"
  shift 5
  # shellcheck disable=SC2086  # SGLANG_ARGS is a list of flags
  setsid "$SGLANG_PYTHON" -m sglang.launch_server --model-path "$model" --host 127.0.0.1 --port "$port" \
    --mem-fraction-static "$fraction" --max-total-tokens "$tokens" \
    --tool-call-parser qwen25 --reasoning-parser qwen3 "$@" ${SGLANG_ARGS:-} \
    >"$OUT/sglang-$name.log" 2>&1 &
  SERVERS+=("$!")
  wait_ready "$name" "http://127.0.0.1:$port/health" "$!"
}

if [[ -n "${WEAK_URL:-}" ]]; then
  echo "gpu-tau2: WEAK_URL and STRONG_URL are set: starting no server" >&2
  wait_ready weak "${WEAK_URL%/}/models"
  wait_ready strong "${STRONG_URL%/}/models"
else
  "$SGLANG_PYTHON" -c "import sglang" 2>/dev/null \
    || fail "$SGLANG_PYTHON cannot import sglang: pip install 'sglang[all]' there, or set SGLANG_PYTHON"
  # The weak server first: each takes its fraction of the memory free when it starts (the split).
  start_server weak "$WEAK_MODEL" "$WEAK_PORT" "$WEAK_MEM_FRACTION" "$WEAK_KV_TOKENS" --enable-return-hidden-states
  start_server strong "$STRONG_MODEL" "$STRONG_PORT" "$STRONG_MEM_FRACTION" "$STRONG_KV_TOKENS"
  WEAK_URL="http://127.0.0.1:$WEAK_PORT/v1"
  STRONG_URL="http://127.0.0.1:$STRONG_PORT/v1"
  if command -v nvidia-smi >/dev/null; then
    # The split as it came out, beside the one on paper.
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv >"$OUT/gpu-memory.csv" || true
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv >>"$OUT/gpu-memory.csv" || true
  fi
fi

# listed ROLE URL: what the endpoint's /models lists. A server answers any model name it is sent, so the
# name this script sends proves nothing; the runner records the same beside each name, in the table too.
listed() {
  local auth=() ids
  [[ -n "${OPENAI_API_KEY:-}" ]] && auth=(-H "Authorization: Bearer $OPENAI_API_KEY")
  ids="$(curl -sf -m 10 "${auth[@]}" "${2%/}/models" \
    | "$PYTHON" -c 'import json, sys; print(", ".join(m["id"] for m in json.load(sys.stdin)["data"]))' 2>/dev/null)" \
    || ids="nothing (its /models did not answer)"
  echo "gpu-tau2: the $1 endpoint lists $ids (asked for: $3)" >&2
}
listed weak "$WEAK_URL" "$WEAK_MODEL"
listed strong "$STRONG_URL" "$STRONG_MODEL"

if [[ -z "${PARAMS:-}" ]]; then
  PARAMS="$OUT/params.toml"
  printf '[run]\nconcurrency = %d\n' "$CONCURRENCY" >"$PARAMS"
fi
common=(
  --data "$DATA" --split "$SPLIT" --trials "$TRIALS" --params "$PARAMS" --cost-model "$COST_MODEL"
  --weak-url "$WEAK_URL" --weak-model "$WEAK_MODEL" --strong-url "$STRONG_URL" --strong-model "$STRONG_MODEL"
  --provider "$PROVIDER" --leash-hidden-dim "$LEASH_DIM"
)
[[ -n "${LIMIT:-}" ]] && common+=(--limit "$LIMIT")
[[ -n "${USER_URL:-}" ]] && common+=(--user-url "$USER_URL")
[[ -n "${USER_MODEL:-}" ]] && common+=(--user-model "$USER_MODEL")
[[ -n "${MAX_TURNS:-}" ]] && common+=(--max-turns "$MAX_TURNS")
[[ -n "${MAX_TOKENS:-}" ]] && common+=(--max-tokens "$MAX_TOKENS")

runs=()
cd "$REPO"
for mode in $MODES; do
  echo "gpu-tau2: $mode over the $SPLIT split" >&2
  "$PYTHON" -m bench.tau2_retail.runner "${common[@]}" --mode "$mode" --out "$OUT/$mode" >"$OUT/$mode.log"
  runs+=("$OUT/$mode")
done
"$PYTHON" -m bench.tau2_retail.table "${runs[@]}" --out "$OUT/table.md"
echo "gpu-tau2: the table is in $OUT/table.md; each mode's summary.md and results.jsonl in $OUT/MODE/" >&2
