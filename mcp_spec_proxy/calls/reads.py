"""The gate's read door: one pipeline for every read, whoever authored it and whichever front it came by.

    audit `read` (buffered, written with the next commit) → the backend's one read door
    (`Backend.call_tool_json`: its raw channel, or the SDK client where progress, a log route or
    the transport asks for it) → `provenance.from_backend` → the step observes the result → wire JSON

A client's lean read (`fronts/fast_read.py`) and its read through the SDK's handler
(`fronts/mcp.py`, through `Barrier.call`) come here alike, and so do the engine's reads and a
substitute's; the backend's answer is checked once (`backends/raw.py`, `tool_result`, and the
size bound), and a call that got no result comes back as its `CallFailed` (`Read.error`) with
the step that observed it — one error shape for every door, raised by the caller where its
client should see it. Only a caller that needs the SDK's model builds
one (`results.as_model`).

Prompts, resources, completions, log levels and subscriptions reach a backend here too, each
audited like a read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import mcp_types as types

from mcp_spec_proxy.backends import BackendPool
from mcp_spec_proxy.calls.audit import AuditSink
from mcp_spec_proxy.calls.drain import SHUTTING_DOWN_REASON, Drain
from mcp_spec_proxy.calls.provenance import from_backend
from mcp_spec_proxy.calls.results import CALL_FAILED, Author, Read, Report, WireResult, as_wire, capped, failed_result
from mcp_spec_proxy.calls.rules import Decision
from mcp_spec_proxy.calls.trail import on_trail
from mcp_spec_proxy.errors import ShuttingDown
from mcp_spec_proxy.observe.logs import about_call
from mcp_spec_proxy.observe.telemetry import Tracing
from mcp_spec_proxy.principal import Principal, who
from mcp_spec_proxy.tools.catalog import CatalogTool, digest
from mcp_spec_proxy.trajectory import Step, observation_text

logger = logging.getLogger(__name__)


class Reads:
    """The gate's doors that forward at once: the gate holds one, sharing its drain and its traces."""

    def __init__(self, backends: BackendPool, audit: AuditSink, drain: Drain, tracing: Tracing) -> None:
        self._backends = backends
        self._audit = audit
        self.drain = drain
        self.tracing = tracing

    async def read(
        self,
        session: str,
        tool: CatalogTool,
        arguments: dict[str, Any],
        step: Step,
        author: Author = "client",
        report: Report | None = None,
        call: str | None = None,
        rule: Decision | None = None,
        principal: Principal | None = None,
    ) -> Read[WireResult]:
        """Forward a read at once, its result as wire JSON; its audit line (naming the rule of `rules:`
        that matched it and `principal`, who asks, where the front knows) is buffered and written with
        the next commit. A `CallFailed` comes back as the read's `error`, with the step that observed
        it (a new step: the one handed in is not changed)."""
        spans = self.tracing.call(call, tool, author, principal)
        with self.admitted(session, tool.name, call, principal), about_call(call, session), spans:
            self._note_read(session, tool, arguments, author, call, rule, principal)
            on_trail()  # a replay of a keyed read may name it now (`fronts/replays.py`)
            started = time.perf_counter()
            result: WireResult
            try:
                backend = self._backends.get(tool.server)
                with self.tracing.forward(tool):
                    result = from_backend(await backend.call_tool_json(tool.original, arguments, report))
            except CALL_FAILED as exc:
                failed = as_wire(failed_result(tool, exc))
                return Read(_observe_wire(step, failed, started), failed, exc)
            except Exception as exc:  # boundary: any other fault of the call, answered or not, is its error result
                result = as_wire(failed_result(tool, exc))
            return Read(_observe_wire(step, result, started), result)

    @contextmanager
    def admitted(
        self,
        session: str,
        what: str,
        call: str | None = None,
        principal: Principal | None = None,
        **about: Any,
    ) -> Iterator[None]:
        """The drain's slot for one call (`Drain.call`); a call refused because the replica is
        shutting down is on the audit trail (`refused`, with `about`, else the tool `what`, and who
        asked): nothing ran, and the trail says why."""
        with ExitStack() as slot:
            try:
                slot.enter_context(self.drain.call(what))
            except ShuttingDown:
                ids = {"call": call} if call is not None else {}
                named = about or {"tool": what}
                refused = {**ids, "session": session, **named, **who(principal)}
                self._audit.note("refused", **refused, reason=SHUTTING_DOWN_REASON)
                raise
            yield

    def _note_read(
        self,
        session: str,
        tool: CatalogTool,
        arguments: dict[str, Any],
        author: Author,
        call: str | None,
        rule: Decision | None = None,
        principal: Principal | None = None,
    ) -> None:
        assert tool.effect == "read", f"{tool.name} is a write: it must be held"
        self._audit.note(
            "read",
            **({"call": call} if call is not None else {}),
            session=session,
            tool=tool.name,
            server=tool.server,
            arguments_digest=digest(arguments),
            author=author,
            why=tool.why,
            **who(principal),
            **(rule.audit() if rule is not None else {}),
        )

    async def get_prompt(
        self,
        session: str,
        server: str,
        name: str,
        arguments: dict[str, str] | None,
        principal: Principal | None = None,
    ) -> Any:
        """A backend's prompt, audited like a read (a backend may do work to render it), naming
        `principal`, who asks, where the front knows — as resources and completions do."""
        with self.admitted(
            session, f"prompt {name!r}", None, principal, server=server, prompt=name
        ):  # in flight for the drain
            audited = {"prompt": name, "arguments_digest": digest(arguments), **who(principal)}
            self._audit.note("prompt", session=session, server=server, **audited)
            return from_backend(await self._backends.get(server).get_prompt(name, arguments))

    async def read_resource(self, session: str, server: str, uri: str, principal: Principal | None = None) -> Any:
        """A backend's resource, audited like a read."""
        with self.admitted(
            session, f"the read of {capped(uri, 500)}", None, principal, server=server, uri=capped(uri, 500)
        ):
            self._audit.note("resource", session=session, server=server, uri=capped(uri, 500), **who(principal))
            return from_backend(await self._backends.get(server).read_resource(uri))

    async def complete(
        self, session: str, server: str, params: types.CompleteRequestParams, principal: Principal | None = None
    ) -> types.CompleteResult:
        """A backend's completion of a prompt's or template's argument, audited like a read; a
        server that declares no `completions` has none to offer (an empty completion)."""
        ref = capped(_ref_name(params.ref), 500)
        with self.admitted(session, f"the completion of {ref}", None, principal, server=server, ref=ref):
            self._audit.note("completion", session=session, server=server, ref=ref, **who(principal))
            backend = self._backends.get(server)
            caps = backend.capabilities
            if caps is not None and caps.completions is None:
                return types.CompleteResult(completion=types.Completion(values=[]))
            return from_backend(await backend.complete(params))

    async def set_logging_level(
        self, session: str, level: types.LoggingLevel, principal: Principal | None = None
    ) -> list[str]:
        """Fan a client's `logging/setLevel` out to every backend (remembered for those that
        connect later); the names of the connected ones that refused it."""
        self._audit.note("log-level", session=session, level=level, **who(principal))
        refused: list[str] = []
        for backend in self._backends.backends.values():
            try:
                await backend.set_logging_level(level)
            except Exception as exc:  # boundary: one backend's refusal must not keep the level from the others
                logger.info("backend %r: logging/setLevel %s refused: %s", backend.name, level, exc)
                refused.append(backend.name)
        return refused

    async def subscribe(self, session: str, server: str, uri: str, principal: Principal | None = None) -> None:
        """Subscribe the proxy to `uri` at the backend that serves it, audited like a read."""
        about = {"server": server, "uri": capped(uri, 500)}
        with self.admitted(session, f"the subscription to {capped(uri, 500)}", None, principal, **about):
            self._audit.note("subscribe", session=session, **about, **who(principal))
            await self._backends.get(server).subscribe(uri)

    async def unsubscribe(self, session: str, server: str, uri: str, principal: Principal | None = None) -> None:
        self._audit.note("unsubscribe", session=session, server=server, uri=capped(uri, 500), **who(principal))
        await self._backends.get(server).unsubscribe(uri)


def _observe_wire(step: Step, result: WireResult, started: float) -> Step:
    """`step` as it ran: a new step with what `result` says, never an edit of the one held."""
    content = result.get("content") or []
    text = observation_text([block for block in content if isinstance(block, dict)])
    return step.observed(text, is_error=bool(result.get("isError")), duration_s=time.perf_counter() - started)


def _ref_name(ref: types.PromptReference | types.ResourceTemplateReference) -> str:
    return ref.name if isinstance(ref, types.PromptReference) else ref.uri


__all__ = ["Reads"]
