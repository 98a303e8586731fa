"""The proxy's exception tree.

    ProxyError                    everything the proxy raises on purpose
    ├── ConfigError               servers.yaml / mcpServers JSON is wrong: names file, key and fix
    ├── BackendError              a wrapped server failed us
    │   ├── BackendUnavailable    not connected (never started, crashed, restarting)
    │   ├── BackendTimeout        a call ran past the server's `timeout`
    │   └── ResultTooLarge        a result past the server's `max_result_bytes`
    ├── ToolNotFound              the client named a tool the catalog does not have
    ├── InvalidArguments          arguments fail the tool's input schema
    └── StateError                the state directory (fingerprints, audit log) cannot be used

Only the MCP front turns these into wire results (`fronts/mcp.py`); everywhere else catches the
specific class it can handle.
"""

from __future__ import annotations


class ProxyError(Exception):
    """Base of every error the proxy raises deliberately."""


class ConfigError(ProxyError):
    """The configuration cannot be used. The message names the file, the key and the fix."""

    def __init__(self, file: str, key: str, problem: str, fix: str = "") -> None:
        self.file = file
        self.key = key
        self.problem = problem
        self.fix = fix
        where = f"{file}: {key}" if key else file
        message = f"{where}: {problem}"
        if fix:
            message += f" — {fix}"
        super().__init__(message)


class BackendError(ProxyError):
    """A wrapped MCP server failed."""

    def __init__(self, server: str, message: str) -> None:
        self.server = server
        super().__init__(f"backend '{server}' {message}")


class BackendUnavailable(BackendError):
    """The backend is not connected right now."""


class BackendTimeout(BackendError):
    """A call to the backend ran past its configured timeout."""


class ResultTooLarge(BackendError):
    """A result was larger than the server's `max_result_bytes`; it is not passed on."""


class ToolNotFound(ProxyError):
    """No tool of that name in the catalog."""


class InvalidArguments(ProxyError):
    """The arguments do not satisfy the tool's input schema."""


class StateError(ProxyError):
    """The proxy's state directory cannot be read or written."""
