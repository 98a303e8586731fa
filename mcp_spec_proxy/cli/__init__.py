"""The command line: the only place that reads the environment and files into config.

mcp-spec-proxy --config servers.yaml                 serve on stdio (Claude Desktop, IDEs)
mcp-spec-proxy --config servers.yaml --http :8765    serve streamable HTTP on 127.0.0.1:8765
mcp-spec-proxy tools                                 every tool with its effect and why
mcp-spec-proxy tools accept NAME                     accept a tool's changed definition, or a new tool
mcp-spec-proxy explain TOOL --args JSON              which rule and which reviewer a call would meet
mcp-spec-proxy check                                 validate the config, say each remote login's state, exit
mcp-spec-proxy init                                  write a servers.yaml from your MCP clients' servers
mcp-spec-proxy shipped-config                        print the shipped servers.yaml, to start your own from
mcp-spec-proxy login SERVER / logout SERVER          a remote backend's OAuth login (`auth:` on the server)
mcp-spec-proxy console-url                           the running proxy's approval console link
mcp-spec-proxy run TASK / gateway / report-outcome   the SpecAgent engine
mcp-spec-proxy bank stats / import / calibrate       LEASH's banks
mcp-spec-proxy store migrate / audit                 the Postgres schema; the audit trail (files or Postgres)

setup.py builds what commands share; serve.py holds the main group (serving, `check`); tools.py,
explain.py, init.py, agent.py and bank.py add their commands to it when imported here, so `main` is complete once this
package is imported (the console script is `mcp_spec_proxy.cli:main`).
"""

from mcp_spec_proxy.cli import agent, bank, explain, init, login, store, tools  # noqa: F401 -- imported to register their commands on `main`
from mcp_spec_proxy.cli.serve import _parse_http as _parse_http  # tests parse --http values directly
from mcp_spec_proxy.cli.serve import main

__all__ = ["main"]
