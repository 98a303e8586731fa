"""The proxy's own tools on the MCP front: `delegate` and `report_outcome`.

* `delegate` runs a whole task with the SpecAgent engine. It is listed only when the engine can
  run some mode, and its schema offers exactly the modes it can run: every mode but `strong-only`
  needs `models.weak`, and `spec+leash` needs a `leash:` section. With the strong model alone it is
  listed as strong-only (its default then), so a client never picks a mode that cannot run.
* `report_outcome` labels a task for LEASH (a `delegate` run by its task id, or else the calling
  session's own work). It is listed only where the operator opened it
  (`leash.client_outcomes`): the agent under review must not label its own work by default.

`access:` sees them as tools of the server `mcp-spec-proxy` (`config/identity.OWN_SERVER`): one a
rule hides is neither listed to that principal nor run for it, its call refused as a tool that does
not exist, as a hidden backend tool's is.

These handlers know nothing of the wire: the front hands them the session, the progress reporter
and the user channel of the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import mcp_types as types

from mcp_spec_proxy.calls.access import shown
from mcp_spec_proxy.config.identity import OWN_SERVER
from mcp_spec_proxy.engine import MODES, Engine, Mode
from mcp_spec_proxy.errors import ProxyError
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.proxy import Proxy
from mcp_spec_proxy.review import UserChannel
from mcp_spec_proxy.sessions.barrier import Report, Session, error_result

if TYPE_CHECKING:  # LEASH (numpy, FAISS) loads only where a `leash:` section opens it
    from mcp_spec_proxy.leash.layers import Leash

DELEGATE = "delegate"
REPORT_OUTCOME = "report_outcome"

REPORT_OUTCOME_TOOL = types.Tool(
    name=REPORT_OUTCOME,
    title="Report whether a task succeeded",
    description=(
        "Tell the proxy whether the user's task was done right, so it learns when to trust the weak model:"
        " give `task_id` for a delegate run, or leave it out to label this session's work."
    ),
    input_schema={
        "type": "object",
        "properties": {
            "success": {"type": "boolean"},
            "task_id": {"type": "string", "description": "The run's id from a delegate trace."},
            "task": {"type": "string", "description": "The task in words, when labelling this session."},
        },
        "required": ["success"],
    },
    annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False),
)


def runnable_modes(engine: Engine | None) -> tuple[Mode, ...]:
    """The modes `engine.run` accepts with the models and LEASH this proxy has (none without an engine)."""
    if engine is None:
        return ()
    return tuple(
        mode
        for mode in MODES
        if (mode == "strong-only" or engine.weak is not None) and (mode != "spec+leash" or engine.watch is not None)
    )


def delegate_tool(modes: tuple[Mode, ...]) -> types.Tool:
    """`delegate`'s definition, offering `modes` (the first is the default)."""
    if "spec" in modes:
        how = (
            "a weak model drafts the steps, reads run at once, and a strong model verifies every segment before"
            " anything changes"
        )
    else:
        how = "the strong model works the task itself, each change still reviewed before it runs"
    return types.Tool(
        name=DELEGATE,
        title="Delegate a task to the proxy's agent",
        description=(
            f"Run a whole task with the proxy's own agent over these tools: {how}. Returns the final answer and a"
            " compact trace."
        ),
        input_schema={
            "type": "object",
            "properties": {
                "task": {"type": "string", "description": "The user's request, in words."},
                "mode": {"type": "string", "enum": list(modes), "default": modes[0]},
                "max_steps": {"type": "integer", "minimum": 1},
            },
            "required": ["task"],
        },
        annotations=types.ToolAnnotations(read_only_hint=False, open_world_hint=True),
    )


class OwnTools:
    """Which of the proxy's own tools this proxy lists, and their handlers."""

    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.modes = runnable_modes(proxy.engine)

    def definitions(self) -> list[types.Tool]:
        """The own tools the client asking now is shown (`access:` may hide each)."""
        tools = [delegate_tool(self.modes)] if self.modes else []
        tools += [REPORT_OUTCOME_TOOL] if self._leash() is not None else []
        return [tool for tool in tools if shown(OWN_SERVER, tool.name)]

    def owns(self, name: str) -> bool:
        """Whether `name` is an own tool the client asking now may call; else it is no tool of ours."""
        listed = (name == DELEGATE and bool(self.modes)) or (name == REPORT_OUTCOME and self._leash() is not None)
        return listed and shown(OWN_SERVER, name)

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        session: Callable[[], Session],
        report: Report | None,
        user: UserChannel,
    ) -> types.CallToolResult:
        if name == DELEGATE:
            return await self._delegate(arguments, report, user, session().principal)
        return await self._report_outcome(arguments, session)

    def _leash(self) -> Leash | None:
        """LEASH, where the operator opened `report_outcome` to clients."""
        config = self.proxy.config.leash
        open_ = config is not None and bool(getattr(config, "client_outcomes", False))
        return self.proxy.leash if open_ else None

    async def _delegate(
        self, arguments: dict[str, Any], report: Report | None, user: UserChannel, principal: Principal | None
    ) -> types.CallToolResult:
        """Run a whole task with the SpecAgent engine; progress per step, cancellation honoured. Its
        steps are `principal`'s: they meet `rules:` as theirs and their audit lines name them."""
        engine = self.proxy.engine
        assert engine is not None
        task, mode, max_steps = arguments.get("task"), arguments.get("mode", self.modes[0]), arguments.get("max_steps")
        if not isinstance(task, str) or not task.strip():
            return error_result("delegate needs `task`: the user's request, in words")
        if mode not in self.modes:
            return error_result(f"delegate: mode must be one of {', '.join(self.modes)}")
        if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
            return error_result("delegate: max_steps must be a positive integer")
        count = 0

        async def progress(message: str) -> None:
            nonlocal count
            count += 1
            if report is not None:
                await report(float(count), None, message)

        try:
            result = await engine.run(
                task, mode, progress=progress, max_steps=max_steps, user=user, principal=principal
            )
        except ProxyError as exc:
            return error_result(str(exc))
        text = result.answer or f"(no answer: {result.status}{': ' + result.error if result.error else ''})"
        return types.CallToolResult(
            content=[
                types.TextContent(type="text", text=text),
                types.TextContent(type="text", text="Trace:\n" + result.trace()),
            ],
            is_error=result.status != "answered",
        )

    async def _report_outcome(
        self, arguments: dict[str, Any], session_of_call: Callable[[], Session]
    ) -> types.CallToolResult:
        """Label a task for LEASH: a `delegate` run by its task id, or else this session's own work."""
        leash = self._leash()
        assert leash is not None
        success = arguments.get("success")
        if not isinstance(success, bool):
            return error_result("report_outcome needs `success`: true if the task was done right, else false")
        task_id = arguments.get("task_id")
        # The client reports it: the party under review (`leash.accept_from` does not trust it by default).
        from mcp_spec_proxy.leash.provenance import Provenance  # LEASH loads only with a `leash:` section

        reporter = session_of_call()
        origin = Provenance("outcome", reporter="agent", session=reporter.id, client=reporter.client)
        if isinstance(task_id, str) and task_id:
            if not await leash.report_outcome(task_id, success, provenance=origin):
                return error_result(f"report_outcome: no run {task_id!r} is remembered (see the delegate trace)")
            text = f"recorded: run {task_id} {'succeeded' if success else 'failed'}"
        else:
            session = session_of_call()
            steps = session.history.committed + session.history.open
            intents = [step.intent for step in steps if step.intent]
            task = str(arguments.get("task") or (intents[0] if intents else f"session {session.id}"))
            await leash.label_task(task, success, meta={"session": session.id}, provenance=origin)
            if success and steps:
                await leash.label_steps(steps, ["success"] * len(steps), source="outcome", provenance=origin)
            text = f"recorded: this session's task {'succeeded' if success else 'failed'}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])
