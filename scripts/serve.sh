#!/usr/bin/env bash
# Set up and run the proxy on the shipped servers.yaml (the README's first command):
#
#   scripts/serve.sh                     # stdio, for Claude Desktop / IDEs / the Inspector
#   scripts/serve.sh --http :8765        # streamable HTTP on 127.0.0.1:8765
#
# Creates .venv on first use, installs the proxy with the PyPI servers servers.yaml names
# (again only when pyproject.toml changes), then runs `mcp-spec-proxy --config servers.yaml`.
# Setup output goes to stderr so stdout stays the MCP channel. Needs python3 and, for the
# filesystem server, Node.js with npx.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
STAMP="$VENV/.serve-deps-stamp"
{
  if [[ ! -x "$VENV/bin/python" ]]; then
    echo "serve.sh: first run: creating $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
  fi
  want="$(sha256sum "$REPO/pyproject.toml" | cut -d' ' -f1)"
  if [[ ! -f "$STAMP" || "$(<"$STAMP")" != "$want" ]]; then
    echo "serve.sh: installing mcp-spec-proxy and the servers servers.yaml names (mcp-server-git, …) into"
    echo "serve.sh: $VENV with pip — about a minute the first time, only again when pyproject.toml changes"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$REPO[servers]" 2>&1 \
      | { grep -v -e 'is ignored: it is neither a file nor a directory' || true; }
    printf '%s' "$want" >"$STAMP"
    echo "serve.sh: installed; starting the proxy (backends log to its state directory's logs/)"
  fi
} >&2
exec "$VENV/bin/mcp-spec-proxy" --config "${PROXY_CONFIG:-$REPO/servers.yaml}" "$@"
