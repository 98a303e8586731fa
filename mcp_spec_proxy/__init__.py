"""mcp-spec-proxy: an MCP server in front of MCP servers; reads pass, writes wait for a verdict.

The names below load on first use (PEP 562): the console script (`launch`) imports this package
to spawn the backends early, before the review machinery and the SDK's types are loaded.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp_spec_proxy.config.schema import ProxyConfig, load_config
    from mcp_spec_proxy.errors import ConfigError, ProxyError
    from mcp_spec_proxy.review import Reviewer, ReviewRequest, Verdict

__version__ = "0.1.0"

_HOMES = {
    "ConfigError": "mcp_spec_proxy.errors",
    "ProxyConfig": "mcp_spec_proxy.config.schema",
    "ProxyError": "mcp_spec_proxy.errors",
    "ReviewRequest": "mcp_spec_proxy.review",
    "Reviewer": "mcp_spec_proxy.review",
    "Verdict": "mcp_spec_proxy.review",
    "load_config": "mcp_spec_proxy.config.schema",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


__all__ = [
    "ConfigError",
    "ProxyConfig",
    "ProxyError",
    "ReviewRequest",
    "Reviewer",
    "Verdict",
    "__version__",
    "load_config",
]
