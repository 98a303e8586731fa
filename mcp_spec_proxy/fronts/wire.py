"""The one place errors become JSON-RPC errors, for every front that answers MCP requests.

A backend's own JSON-RPC error (the SDK's `MCPError`) goes out as the backend sent it: code,
message and data, whatever the code. The proxy's own errors go out with the codes of
`errors.py` and the words their raiser chose; a tool the catalog does not have is Invalid
Params, as a server says of a tool it does not know. The proxy's own error about a call that
reached the gate names that call in its `data` (`CALL_META`), so a client can ask about it.
"""

from __future__ import annotations

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from mcp_spec_proxy.errors import BackendError, CallReplayed, ProxyError, ShuttingDown, ToolNotFound
from mcp_spec_proxy.results import CALL_META, FIRST_META
from mcp_spec_proxy.wire_types import CallErrorData


def wire_error(exc: ProxyError | MCPError, call: str | None = None) -> MCPError:
    """`exc` as the JSON-RPC error the client gets; `call` is the call it is about, if any."""
    if isinstance(exc, MCPError):
        return MCPError(exc.code, exc.message, exc.data)  # as the backend sent it
    if isinstance(exc, ToolNotFound):
        return MCPError(code=INVALID_PARAMS, message=str(exc), data=exc.data)
    data: CallErrorData | None = {CALL_META: call} if call is not None else None
    if isinstance(exc, CallReplayed):
        data = {**(data or {}), FIRST_META: exc.first}
    code = exc.code if isinstance(exc, BackendError | CallReplayed | ShuttingDown) else INTERNAL_ERROR
    return MCPError(code=code, message=str(exc), data=data)


__all__ = ["wire_error"]
