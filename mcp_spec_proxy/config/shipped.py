"""The servers.yaml the project ships, inside the installed package.

A checkout has it at the repository root; an installed wheel (pip, pipx, uv) has no checkout, so the
same file travels as package data (`mcp_spec_proxy/config/servers.yaml`, a link to the root file in
the repository, a copy in the wheel). `mcp-spec-proxy shipped-config` prints it: the starting point of
a user's own file.
"""

from __future__ import annotations

from importlib.resources import files

SHIPPED_NAME = "servers.yaml"


def shipped_config_text() -> str:
    """The text of the shipped servers.yaml, as installed with the package."""
    return (files("mcp_spec_proxy.config") / SHIPPED_NAME).read_text(encoding="utf-8")
