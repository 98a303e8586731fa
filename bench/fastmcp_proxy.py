"""fastmcp's proxy in front of one stdio backend, for bench/overhead.py (run with fastmcp's own venv).

    .bench/fastmcp/bin/python bench/fastmcp_proxy.py [--http PORT] -- <command> <args...>

`create_proxy` over one connected `fastmcp.Client`, so every call reuses one backend session
(fastmcp's fastest setup; a disconnected client would open a session per request). Its `mcp`
pin may differ from ours: it never imports this project.
"""

from __future__ import annotations

import sys

from fastmcp import Client
from fastmcp.client.transports import StdioTransport
from fastmcp.server import create_proxy


def main() -> None:
    argv = sys.argv[1:]
    port = None
    if argv[:1] == ["--http"]:
        port, argv = int(argv[1]), argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        sys.exit("usage: fastmcp_proxy.py [--http PORT] -- <command> <args...>")
    proxy = create_proxy(Client(StdioTransport(command=argv[0], args=argv[1:])), name="fastmcp-proxy")
    if port is None:
        proxy.run(show_banner=False)
    else:
        proxy.run(transport="http", host="127.0.0.1", port=port, show_banner=False, log_level="warning")


if __name__ == "__main__":
    main()
