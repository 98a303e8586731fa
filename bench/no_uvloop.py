"""mcp-spec-proxy on the default asyncio loop even where uvloop is installed, for bench/overhead.py.

    python bench/no_uvloop.py --config servers.yaml ...   (the proxy's own arguments)

The proxy runs on uvloop whenever it can import it; this hides uvloop from it, so one run can
measure the proxy on both loops side by side (`python -m bench.overhead --uvloop-ab`).
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.machinery import ModuleSpec

_find_spec = importlib.util.find_spec


def _without_uvloop(name: str, package: str | None = None) -> ModuleSpec | None:
    return None if name == "uvloop" else _find_spec(name, package)


if __name__ == "__main__":
    importlib.util.find_spec = _without_uvloop
    from mcp_spec_proxy.cli import main

    sys.argv[0] = "mcp-spec-proxy"
    main()
