#!/usr/bin/env bash
# The project's one test command (README, CI's .ci/run):
#
#   scripts/test.sh [pytest args...]
#
# Works on a fresh clone: creates .venv, installs '.[test]' (again only when
# pyproject.toml changes), installs the real MCP backends under .backends/,
# pgvector rebuilt portably for the embedded PostgreSQL (scripts/portable-pgvector.sh: the
# wheel's own needs AVX-512), Debian's chromium for the approval console's browser tests (apt-get, when
# run as root; otherwise it says how, and those tests are skipped),
# and the local model the `real_model` tests run against (scripts/local-model.sh
# --install-only: xllamacpp and SmolLM2-135M, once), then runs ruff check, ruff
# format --check, mypy (strict, on mcp_spec_proxy, tests and bench) and pytest;
# pytest runs the `real_model` and `real_install` tests after the fast ones (tests/conftest.py). Setup stops at
# its first error; the four checks all run, and the exit status is non-zero
# if any of them failed. Arguments go to pytest unchanged.
# Env: PYTHON (default python3) is the interpreter used to create .venv.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PYTHON="${PYTHON:-python3}"
VENV="$REPO/.venv"
STAMP="$VENV/.test-deps-stamp"
LINT_PATHS=(mcp_spec_proxy tests scripts bench)

stage() { printf '\n==> %s\n' "$*"; }

stage "venv: .venv"
if [[ -d "$VENV" ]] && ! "$VENV/bin/python" -c '' 2>/dev/null; then
  echo "  .venv is broken (interpreter gone); recreating"
  rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" --version

stage "deps: pip install -e '.[test]'"
[[ -f pyproject.toml ]] || { echo "pyproject.toml not found in $REPO" >&2; exit 1; }
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [[ -f "$STAMP" && "$(<"$STAMP")" == "$want" ]]; then
  echo "  up to date (pyproject.toml unchanged)"
else
  rm -f "$STAMP"
  # Drop pip's per-package warnings about this machine's absent local index
  # dirs; pipefail keeps pip's exit status.
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]' 2>&1 \
    | { grep -v -e 'is ignored: it is neither a file nor a directory' || true; }
  printf '%s' "$want" >"$STAMP"
fi

stage "backends: scripts/install-test-backends.sh"
PYTHON="$PYTHON" bash "$REPO/scripts/install-test-backends.sh"
echo "  ready in .backends/"

stage "pgvector: scripts/portable-pgvector.sh (runs on any CPU, AVX-512 or not)"
bash "$REPO/scripts/portable-pgvector.sh" "$VENV"

stage "browser: chromium (the approval console's browser tests)"
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  echo "  $(command -v chromium || command -v chromium-browser)"
elif [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
  echo "  installed $(command -v chromium)"
else
  echo "  no chromium: the browser tests will be skipped; install it (Debian: sudo apt-get install chromium)"
fi

stage "local model: scripts/local-model.sh --install-only"
PYTHON="$PYTHON" bash "$REPO/scripts/local-model.sh" --install-only

failed=()
run_check() {
  local name="$1"
  shift
  stage "$name"
  local rc=0
  "$@" || rc=$?
  if ((rc != 0)); then
    failed+=("$name (exit $rc)")
  fi
}

run_check "ruff check" "$VENV/bin/ruff" check "${LINT_PATHS[@]}"
run_check "ruff format --check" "$VENV/bin/ruff" format --check "${LINT_PATHS[@]}"
run_check "mypy" "$VENV/bin/mypy" mcp_spec_proxy tests bench
run_check "pytest" "$VENV/bin/python" -m pytest "$@"

# On success pytest's summary stays the last line of output.
if ((${#failed[@]})); then
  echo
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
