"""fastmcp's proxy in front of one backend, for bench/overhead.py and bench/conformance.py (run
with fastmcp's own venv).

    .bench/fastmcp/bin/python bench/fastmcp_proxy.py [--http PORT] -- <command> <args...>
    .bench/fastmcp/bin/python bench/fastmcp_proxy.py [--http PORT] --url <streamable HTTP URL>

`create_proxy` over one connected `fastmcp.Client`, so every call reuses one backend session
(fastmcp's fastest setup; a disconnected client would open a session per request). Its `mcp`
pin may differ from ours: it never imports this project.
"""

from __future__ import annotations

import sys

from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport
from fastmcp.server import create_proxy


def main() -> None:
    argv = sys.argv[1:]
    port = None
    if argv[:1] == ["--http"]:
        port, argv = int(argv[1]), argv[2:]
    remote = argv[:1] == ["--url"] and len(argv) == 2
    if remote:
        backend = Client(StreamableHttpTransport(argv[1]))
    else:
        if argv[:1] == ["--"]:
            argv = argv[1:]
        if not argv:
            sys.exit("usage: fastmcp_proxy.py [--http PORT] (-- <command> <args...> | --url URL)")
        backend = Client(StdioTransport(command=argv[0], args=argv[1:]))
    proxy = create_proxy(backend, name="fastmcp-proxy")
    if port is None:
        proxy.run(show_banner=False)
    else:
        # In front of a remote server (bench/conformance.py), uvicorn's info line says when it listens.
        level = "info" if remote else "warning"
        proxy.run(transport="http", host="127.0.0.1", port=port, show_banner=False, log_level=level)


if __name__ == "__main__":
    main()
