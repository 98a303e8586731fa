"""A two-tool MCP server for the local-model demo: `read_notes` (a read) and `add_note` (a write).

    python examples/notes_server.py        # stdio; the notes live in $NOTES_FILE (one note a line)

It gives the demo a call the write barrier holds, so a run shows a verdict; it needs nothing but
the `mcp` SDK the proxy already installs, and no network.
"""

from __future__ import annotations

import os
from pathlib import Path

import mcp_types as types
from mcp.server.mcpserver import MCPServer

NOTES = Path(os.environ.get("NOTES_FILE", "notes.txt"))
server = MCPServer("notes")


@server.tool(annotations=types.ToolAnnotations(read_only_hint=True))
def read_notes() -> str:
    """Return every note, one a line."""
    return NOTES.read_text(encoding="utf-8") if NOTES.exists() else "(no notes yet)"


@server.tool(annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False))
def add_note(text: str) -> str:
    """Append one note (a line of text) to the notes."""
    with NOTES.open("a", encoding="utf-8") as notes:
        notes.write(text.replace("\n", " ") + "\n")
    return f"added: {text}"


if __name__ == "__main__":
    server.run()
