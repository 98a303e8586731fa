"""The gateway's sessions: which one a request continues, and when one is let go.

A chat-completions client sends its whole conversation with every request and, unless it sends
`X-Session-Id`, names no session. A request continues a session only when

* everything the session has taken in from its client — every message of the requests it
  consumed, in order, hashed — is an exact prefix of the request's messages, and
* what follows is what the session waits for: the client's result for a tool call it handed out
  (the call's id is random and went to that client alone), or, after an answer, that answer and
  then the user's next message.

Anything else starts a new session. So two conversations that open alike never share one, never
see each other's text and never wait on each other, and a question asked again in a new chat is
answered afresh. What a request can reach of a session it continues is what its own messages
already say, and the gateway's own tool results for those same words. Under a name
(`X-Session-Id`) the same rule holds within the name, and a request that does not continue the
named session starts the name over.

Under `auth:` a session belongs to the principal that opened it (`owner`, the principal's key):
a request continues only a session of its own principal, and a name is each principal's own, so
another principal's token neither continues a conversation nor starts its name over.

A session is let go when idle for `gateway.session_idle_s` and, past `gateway.max_sessions`, the
least recently used first: its run is cancelled (the gate audits a call that cancel interrupts),
and a request still waiting on it is answered with an error.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from mcp_spec_proxy.engine import RunResult
from mcp_spec_proxy.fronts.chat_wire import message_text
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.trajectory import Step

EMPTY = hashlib.sha256(b"mcp-spec-proxy gateway transcript").digest()
"""The digest of no messages: where every session starts."""


@dataclass
class ToolCallOut:
    """The run needs a client tool: the request is answered with this call."""

    step: Step
    call_id: str


@dataclass
class Answer:
    text: str
    result: RunResult
    finish: str = "stop"


@dataclass
class Failure:
    message: str
    # 424, not 502: SDKs (openai's included) retry 5xx, and a retried turn finds its messages taken.
    status: int = 424
    code: str = "upstream_error"


Action = ToolCallOut | Answer | Failure


@dataclass
class _Pending:
    step: Step
    done: anyio.Event = field(default_factory=anyio.Event)
    observation: str = ""
    is_error: bool = False


class GatewaySession:
    """One client conversation: the models' transcript, the running task, the calls out to the client."""

    def __init__(self, name: str | None, now: float, principal: Principal | None = None) -> None:
        self.key = f"gw-{uuid.uuid4().hex[:16]}"  # for telemetry and logs; never taken from a request
        self.name = name
        self.principal = principal  # who opened it (a verified token's), None where nobody is identified
        self.owner = principal.key if principal is not None else ""
        self.transcript: list[dict[str, Any]] = []  # what the models see
        self.consumed = 0  # client messages already taken in
        self.digest = EMPTY  # of those messages, as `prefix_digests` hashes them
        self.answer: str | None = None  # the last answer handed out, while it is the session's last word
        self.pending: dict[str, _Pending] = {}
        self.running = False
        self.busy = 0  # requests in flight
        self.last_used = now
        self.lock = anyio.Lock()
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.scope = anyio.CancelScope()  # the run's; cancelled when the session is let go
        self.ended = anyio.Event()  # the run (if one started) has finished
        self.ended.set()
        send, receive = anyio.create_memory_object_stream[Action](16)
        self.actions_in: MemoryObjectSendStream[Action] = send
        self.actions_out: MemoryObjectReceiveStream[Action] = receive

    async def call(self, step: Step) -> tuple[str, bool]:
        """The engine's way to run a client tool: hand it to the client, wait for its result."""
        call_id = f"call_{uuid.uuid4().hex[:16]}"
        pending = self.pending[call_id] = _Pending(step)
        try:
            await self.actions_in.send(ToolCallOut(step, call_id))
            await pending.done.wait()
        finally:
            self.pending.pop(call_id, None)  # a run that timed out waiting leaves no call to answer
        return pending.observation, pending.is_error

    def observe(self, kind: str, data: dict[str, Any]) -> None:
        self.events.append((kind, data))

    def drain(self) -> list[tuple[str, dict[str, Any]]]:
        events, self.events = self.events, []
        return events

    def continued_by(self, messages: Sequence[dict[str, Any]], digests: Sequence[bytes]) -> bool:
        """Whether `messages` go on from exactly where this session is (see the module's rule)."""
        n = self.consumed
        if len(messages) <= n or digests[n] != self.digest:
            return False
        new = messages[n:]
        if self.running:
            return any(m.get("role") == "tool" and str(m.get("tool_call_id")) in self.pending for m in new)
        if self.answer is None or new[0].get("role") != "assistant":
            return False
        echoed = message_text(new[0].get("content")).strip() == self.answer.strip()
        return echoed and any(m.get("role") == "user" for m in new[1:])

    def took_in(self, messages: Sequence[dict[str, Any]], digest: bytes, now: float) -> None:
        self.consumed, self.digest, self.answer, self.last_used = len(messages), digest, None, now

    def close(self) -> None:
        """Let go: the run is cancelled, and a request waiting on it hears the stream end."""
        self.scope.cancel()
        self.actions_in.close()


def prefix_digests(messages: Sequence[dict[str, Any]]) -> list[bytes]:
    """`digests[i]` stands for `messages[:i]`: one hash chain, so every prefix costs one pass.

    A client's own messages are hashed as sent; the gateway's answers, which the client echoes
    back in whatever shape its SDK writes, by their text and tool call ids alone.
    """
    chain = hashlib.sha256(EMPTY)
    digests = [EMPTY]
    for message in messages:
        if message.get("role") == "assistant":
            calls = message.get("tool_calls") or []
            ids = [str(c.get("id")) for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
            form: Any = {"role": "assistant", "text": message_text(message.get("content")), "calls": ids}
        else:
            form = message
        encoded = json.dumps(form, sort_keys=True, separators=(",", ":")).encode("ascii")
        chain.update(len(encoded).to_bytes(8, "big") + encoded)
        digests.append(chain.copy().digest())
    return digests


class Sessions:
    """Every live session, least recently used first, and the digest each one has reached."""

    def __init__(self, max_sessions: int, idle_s: float, clock: Callable[[], float]) -> None:
        self._max = max_sessions
        self._idle_s = idle_s
        self.clock = clock
        self._all: OrderedDict[str, GatewaySession] = OrderedDict()
        self._named: dict[tuple[str, str], GatewaySession] = {}  # by owner and name
        self._at: dict[bytes, list[GatewaySession]] = {}  # unnamed sessions by the prefix they consumed

    def __len__(self) -> int:
        return len(self._all)

    def find(
        self, name: str | None, messages: Sequence[dict[str, Any]], digests: Sequence[bytes], owner: str = ""
    ) -> GatewaySession | None:
        """The session of `owner` (a principal's key) these messages continue, if any: the longest
        prefix wins, then the latest used."""
        if name is not None:
            named = self._named.get((owner, name))
            return named if named is not None and named.continued_by(messages, digests) else None
        for n in range(len(messages) - 1, -1, -1):
            for session in reversed(self._at.get(digests[n], ())):
                if session.owner == owner and session.continued_by(messages, digests):
                    return session
        return None

    def took_in(
        self, session: GatewaySession, messages: Sequence[dict[str, Any]], digest: bytes
    ) -> list[GatewaySession]:
        """Record what `session` has consumed (adding it if new); the sessions let go to make room."""
        if session.name is None:
            self._unindex(session)
        session.took_in(messages, digest, self.clock())
        let_go: list[GatewaySession] = []
        if session.key not in self._all:
            if session.name is not None and (old := self._named.get((session.owner, session.name))) is not None:
                let_go.append(self._drop(old))  # the name starts over
            while len(self._all) >= self._max:
                idle = next((s for s in self._all.values() if not s.busy), None)
                let_go.append(self._drop(idle or next(iter(self._all.values()))))
            if session.name is not None:
                self._named[(session.owner, session.name)] = session
        self._all[session.key] = session
        self._all.move_to_end(session.key)
        if session.name is None:
            self._at.setdefault(digest, []).append(session)
        return let_go

    def out_with_clients(self) -> list[str]:
        """Each tool call handed to a client whose result its turn waits for, as `tool (session KEY)`."""
        return [
            f"{pending.step.tool} (session {session.key})"
            for session in self._all.values()
            for pending in list(session.pending.values())
            if not pending.done.is_set()
        ]

    def touch(self, session: GatewaySession) -> None:
        session.last_used = self.clock()
        if session.key in self._all:
            self._all.move_to_end(session.key)

    def sweep(self) -> list[GatewaySession]:
        """Let go of every session idle past `session_idle_s` (one with a request in flight is not idle)."""
        now = self.clock()
        let_go = []
        for session in list(self._all.values()):
            if now - session.last_used < self._idle_s:
                break
            if not session.busy:
                let_go.append(self._drop(session))
        return let_go

    def drop(self, session: GatewaySession) -> None:
        if self._all.get(session.key) is session:
            self._drop(session)

    def _drop(self, session: GatewaySession) -> GatewaySession:
        del self._all[session.key]
        if session.name is not None and self._named.get((session.owner, session.name)) is session:
            del self._named[(session.owner, session.name)]
        self._unindex(session)
        session.close()
        return session

    def _unindex(self, session: GatewaySession) -> None:
        at = self._at.get(session.digest)
        if at is not None and session in at:
            at.remove(session)
            if not at:
                del self._at[session.digest]
