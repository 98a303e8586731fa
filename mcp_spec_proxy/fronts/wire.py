"""The one place errors become JSON-RPC errors, for every front that answers MCP requests.

A backend's own JSON-RPC error (the SDK's `MCPError`) goes out as the backend sent it: code,
message and data, whatever the code. The proxy's own errors go out with the codes of
`errors.py` and the words their raiser chose; a tool the catalog does not have is Invalid
Params, as a server says of a tool it does not know.
"""

from __future__ import annotations

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from mcp_spec_proxy.errors import BackendError, ProxyError, ToolNotFound


def wire_error(exc: ProxyError | MCPError) -> MCPError:
    """`exc` as the JSON-RPC error the client gets."""
    if isinstance(exc, MCPError):
        return MCPError(exc.code, exc.message, exc.data)  # as the backend sent it
    if isinstance(exc, ToolNotFound):
        return MCPError(code=INVALID_PARAMS, message=str(exc), data=exc.data)
    code = exc.code if isinstance(exc, BackendError) else INTERNAL_ERROR
    return MCPError(code=code, message=str(exc))


__all__ = ["wire_error"]
