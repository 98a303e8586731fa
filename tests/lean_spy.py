"""A spy on the lean HTTP lane (`fronts/lean_http.py`) for tests that run a front with it and without it.

`spied_install(...)` stands in for `lean_http.install` (patched in by the test): with `lean`, the lane
is installed and every request it is offered appends whether it answered it to `took`; without, every
request takes the SDK's path (`json_mode`: the SDK's transport answering each with one JSON body).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp

from mcp_spec_proxy.fronts import lean_http
from mcp_spec_proxy.fronts.mcp import McpFront


def spied_install(
    lean: bool, took: list[bool], *, json_mode: bool = False, wrap: Callable[[ASGIApp], ASGIApp] | None = None
) -> Callable[[McpFront, Any], None]:
    """`lean_http.install`, counted (`wrap`: around the session manager's request handling, the lane inside)."""
    install = lean_http.install

    def spied(front: McpFront, manager: Any) -> None:
        if not lean:
            manager.json_response = json_mode
            return  # every request takes the SDK's path
        install(front, manager)
        app = manager.asgi_app.app  # the lane, inside the SDK's body limit
        lane = app._took

        async def counted(*args: Any) -> bool:
            answered: bool = await lane(*args)
            took.append(answered)
            return answered

        app._took = counted
        if wrap is not None:
            manager.asgi_app = wrap(manager.asgi_app)

    return spied
