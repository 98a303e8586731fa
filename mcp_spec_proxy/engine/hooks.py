"""What a run calls out to: LEASH's watch, the client that runs its own tools, the person a
`human` tool asks, and the callbacks that hear of progress and of every model call and verdict.

Each is optional; a run without a watch, an observer or a progress callback behaves as if it were
not there, one without a client fails at a client tool, and one without a user (`NoUser`) leaves
a `human` tool to its configured fallback.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from mcp_spec_proxy.review import InputNeeded, UserChannel
from mcp_spec_proxy.trajectory import Step

Progress = Callable[[str], Awaitable[None]]
Observer = Callable[[str, dict[str, Any]], None]


class Watch(Protocol):
    """What LEASH contributes to a run (`spec+leash`); `leash/layers.py` implements it."""

    async def route(self, task: str) -> bool:
        """True: the task's neighbours mostly failed under the weak model — let the strong model lead."""
        ...

    async def drafted(self, step: Step, hidden: Any) -> bool:
        """True: this drafted read looks like past rejected steps — hold it and verify now."""
        ...

    async def unreviewed(self, step: Step, hidden: Any) -> bool:
        """True: a step no one would review looks like past failures — review it after all."""
        ...

    async def verdict(self, steps: tuple[Step, ...], accepted_steps: int) -> None:
        """Labels for free: the accepted prefix succeeded, the first rejected step failed."""
        ...

    async def finished(self, task_id: str, task: str, steps: list[Step]) -> None:
        """Remember the run, so a later outcome report can label it."""
        ...


class ClientExecutor(Protocol):
    """Runs a tool that lives in the client (the gateway's OpenAI-style clients)."""

    async def call(self, step: Step) -> tuple[str, bool]:
        """The observation text and whether it is an error, once the client has run `step`."""
        ...


class NoUser:
    """No person to ask (`run`, the gateway): a `human` tool gets the configured fallback."""

    async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        return None


class AskNow:
    """The delegating client's user, asked in place: a run cannot pause for a retry of the call,
    so a client that can only answer on a retry (`input_required`) counts as one that cannot ask."""

    def __init__(self, user: UserChannel) -> None:
        self._user = user

    async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return await self._user.confirm(message, schema)
        except InputNeeded:
            return None
