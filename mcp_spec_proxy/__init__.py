"""mcp-spec-proxy: an MCP server in front of MCP servers; reads pass, writes wait for a verdict."""

from mcp_spec_proxy.config import ProxyConfig, load_config
from mcp_spec_proxy.errors import ConfigError, ProxyError
from mcp_spec_proxy.review import Reviewer, ReviewRequest, Verdict

__version__ = "0.1.0"

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
