"""The proxy's exception tree, and its own JSON-RPC error codes.

Every class the proxy raises on purpose, wherever it is defined (the module is named where it is
not this one); `tests/test_error_tree.py` holds this drawing to the classes.

    ProxyError                  everything the proxy raises on purpose                       wire code
    ├── ConfigError             a config file is wrong: every mistake, each with file:line, key, fix
    ├── BackendError            a wrapped server failed us                                   -32010
    │   ├── BackendUnavailable  not connected (never started, exited, reconnecting)          -32011
    │   │   └── BackendClosed   its connection ended while a call waited                     -32012
    │   ├── BackendTimeout      the proxy waited the server's `timeout` and stopped          -32013
    │   └── ResultTooLarge      a result past the server's `max_result_bytes`                -32014
    ├── ToolNotFound            the client named a tool the catalog does not have            -32602
    ├── InvalidArguments        arguments fail the tool's input schema (the client gets a tool error result)
    ├── CallReplayed            a call's idempotency key is another call's: not forwarded    -32015
    ├── ShuttingDown            the replica is draining and takes no new call: nothing ran   -32016
    ├── StateError              the state directory or database (audit, fingerprints) cannot be used
    ├── ModelError              models.py: a model call failed, or its answer is no chat completion
    ├── ReviewFailed            review/: the reviewer could not produce a verdict
    ├── ConsoleRefused          review/console.py: a decision the approval queue will not take
    ├── LeashError              leash/encoders.py: LEASH cannot do what was asked
    │   ├── EncoderError        leash/encoders.py: an encoder cannot produce vectors
    │   └── BankError           leash/storage.py: a bank cannot be loaded or saved
    │       └── BankMismatch    leash/storage.py: the bank on disk was made by another encoder
    └── BadRequest              fronts/gateway.py: a request the gateway refuses (its HTTP status)

A class without a code that reaches `wire_error` goes out as Internal Error (-32603), with its
words. A signal is not an error and is not in this tree: `InputNeeded` (review/), "ask the
client, then retry", derives from `Exception` itself, so no `except ProxyError` takes it for a
failure (STYLE.md, rule 16).

A backend's own JSON-RPC error is not in this tree: it is the SDK's `MCPError`, and it reaches
the client as the backend sent it (code, message, data), except a code of the proxy's band, which
goes out as the backend's (`provenance.backend_error`). Only what the proxy
observed itself — its own clock, the transport really ending, its own size bound — becomes a
`BackendError`. The proxy's codes sit in JSON-RPC's implementation-defined server-error band
(-32000..-32019, where the SDK keeps -32000 and -32001 for its own), away from the SDK's, so a
client can tell the proxy's words from a backend's by code: a backend that *sends* one of these
codes reaches the client with -32603 and its code under `data["mcp-spec-proxy/backend-code"]`
(docs/SECURITY.md).

`fronts/wire.py` (`wire_error`) is the one place these become JSON-RPC errors; everywhere else
catches the specific class it can handle. (No SDK import here: `config/commands.py` raises these before
the SDK is loaded.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

BACKEND_FAILED = -32010
"""A backend failed in a way the proxy saw (no narrower code fits): an answer that is no result."""
BACKEND_UNAVAILABLE = -32011
"""The backend is not connected: nothing was sent to it."""
BACKEND_CLOSED = -32012
"""The backend's connection ended before it answered: the call may have run."""
BACKEND_TIMEOUT = -32013
"""The proxy's own clock ran out (the server's `timeout`); it told the backend to cancel."""
RESULT_TOO_LARGE = -32014
"""The result was over the server's `max_result_bytes` and was withheld."""
CALL_REPLAYED = -32015
"""The call's idempotency key belongs to another call of its session: this one was not forwarded."""
SHUTTING_DOWN = -32016
"""The replica is shutting down: the call was not taken (or, held when the drain ran out, not forwarded)."""


class ProxyError(Exception):
    """Base of every error the proxy raises deliberately."""


@dataclass(frozen=True)
class ConfigProblem:
    """One mistake in a config file: where (the file, with `:line` where it is known), the key,
    what is wrong and what to change."""

    file: str
    key: str
    problem: str
    fix: str = ""

    def __str__(self) -> str:
        where = f"{self.file}: {self.key}" if self.key else self.file
        return f"{where}: {self.problem}" + (f" — {self.fix}" if self.fix else "")


class ConfigError(ProxyError):
    """The configuration cannot be used. Each problem names the file, the key and the fix; a file
    with several mistakes is one error naming all of them (`problems`, in the file's order), so
    one run shows everything to change. `file`, `key`, `problem` and `fix` are the first's."""

    def __init__(self, file: str, key: str, problem: str, fix: str = "", *, more: Sequence[ConfigProblem] = ()) -> None:
        self.file = file
        self.key = key
        self.problem = problem
        self.fix = fix
        self.problems = (ConfigProblem(file, key, problem, fix), *more)
        if not more:
            super().__init__(str(self.problems[0]))
            return
        lines = "\n".join(f"  {problem}" for problem in self.problems)
        super().__init__(f"{len(self.problems)} problems in the configuration:\n{lines}")

    @classmethod
    def of(cls, problems: Sequence[ConfigProblem]) -> ConfigError:
        """One error for every problem given (at least one)."""
        first, *more = problems
        return cls(first.file, first.key, first.problem, first.fix, more=more)


class BackendError(ProxyError):
    """A wrapped MCP server failed, as the proxy observed it."""

    code: ClassVar[int] = BACKEND_FAILED

    def __init__(self, server: str, message: str) -> None:
        self.server = server
        super().__init__(f"backend '{server}' {message}")


class BackendUnavailable(BackendError):
    """The backend is not connected right now."""

    code: ClassVar[int] = BACKEND_UNAVAILABLE


class BackendClosed(BackendUnavailable):
    """The backend's connection ended (its transport closed) while a call waited for its answer."""

    code: ClassVar[int] = BACKEND_CLOSED


class BackendTimeout(BackendError):
    """A call to the backend ran past its configured timeout, on the proxy's own clock."""

    code: ClassVar[int] = BACKEND_TIMEOUT


class ResultTooLarge(BackendError):
    """A result was larger than the server's `max_result_bytes`; it is not passed on."""

    code: ClassVar[int] = RESULT_TOO_LARGE


class ToolNotFound(ProxyError):
    """No tool (prompt, resource) of that name in the catalog. `data` goes out with the wire error
    (a resource's `uri`, as a server says which resource it does not have)."""

    def __init__(self, message: str, data: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.data = data


class InvalidArguments(ProxyError):
    """The arguments do not satisfy the tool's input schema."""


class CallReplayed(ProxyError):
    """A call whose idempotency key another call of its session holds (`first`): it is not forwarded."""

    code: ClassVar[int] = CALL_REPLAYED

    def __init__(self, first: str, message: str) -> None:
        self.first = first
        super().__init__(message)


class ShuttingDown(ProxyError):
    """The replica is draining (SIGTERM): a new call is refused, and a call still held when the
    drain's grace ran out is abandoned. Nothing was forwarded either way."""

    code: ClassVar[int] = SHUTTING_DOWN


class StateError(ProxyError):
    """The proxy's state directory cannot be read or written."""
