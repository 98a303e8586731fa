"""The one place errors become JSON-RPC errors, for every front that answers MCP requests.

A backend's own JSON-RPC error (the SDK's `MCPError`) goes out as the backend's, through
`provenance.backend_error`: its message, code and data as it sent them, except what only the
proxy may say. A code of the proxy's band (-32010..-32019) goes out as Internal Error (-32603)
with the backend's code in `data["mcp-spec-proxy/backend-code"]` (a `data` that is no object
beside it, under `data["mcp-spec-proxy/backend-data"]`), and `mcp-spec-proxy/` keys of its
`data` are dropped: so a backend that answers -32016 "nothing ran", or names a call in
`data["mcp-spec-proxy/call"]`, cannot make a write that ran look as if the proxy refused it.

The proxy's own errors go out with the codes of `errors.py` and the words their raiser chose; a
tool the catalog does not have is Invalid Params, as a server says of a tool it does not know.
The proxy's own error about a call that reached the gate names that call in its `data`
(`CALL_META`), so a client can ask about it.
"""

from __future__ import annotations

from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from mcp_spec_proxy.calls.provenance import backend_error
from mcp_spec_proxy.calls.results import CALL_META, FIRST_META
from mcp_spec_proxy.errors import BackendError, CallReplayed, ProxyError, ShuttingDown, ToolNotFound
from mcp_spec_proxy.wire_types import CallErrorData


class WireError(MCPError):
    """An error already as the client gets it (`wire_error`'s answer): a handler that catches it
    again on its way out passes it on as it is, never as a backend's."""


def wire_error(exc: ProxyError | MCPError, call: str | None = None) -> WireError:
    """`exc` as the JSON-RPC error the client gets; `call` is the call it is about, if any. A
    backend's `MCPError` keeps its words but never the proxy's codes or keys (see above)."""
    if isinstance(exc, WireError):
        return WireError(exc.code, exc.message, exc.data)  # settled already, by an inner handler
    if isinstance(exc, MCPError):
        passed = backend_error(exc)  # the backend's, as it sent it, less what only the proxy may say
        return WireError(passed.code, passed.message, passed.data)
    if isinstance(exc, ToolNotFound):
        return WireError(code=INVALID_PARAMS, message=str(exc), data=exc.data)
    data: CallErrorData | None = {CALL_META: call} if call is not None else None
    if isinstance(exc, CallReplayed):
        data = {**(data or {}), FIRST_META: exc.first}
    code = exc.code if isinstance(exc, BackendError | CallReplayed | ShuttingDown) else INTERNAL_ERROR
    return WireError(code=code, message=str(exc), data=data)


__all__ = ["WireError", "wire_error"]
