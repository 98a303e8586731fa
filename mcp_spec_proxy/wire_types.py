"""The wire shapes the proxy builds itself, as types: JSON-RPC messages and the OpenAI chat wire.

Annotations only: a `TypedDict` is a plain dict at run time, so nothing here changes a byte the
proxy writes. It types what the proxy writes in its own words (an error object, a request it
sends a backend, a response it answers with, a completion the gateway returns); what a client or
a backend sends stays `dict[str, Any]` until it is checked, because the proxy passes through
keys it does not know (`DESIGN.md`, "Transparent, except where the gate acts").

It sits at the bottom of the house (it imports nothing of the package), so backends, the gate
and the fronts may all import it. A request id is the SDK's `RequestId` (a string or an integer).
Two shapes live beside their builders instead: a read's tool result (`backends/raw.WireResult`)
and the fields every audit line of a held call starts with (`results.AuditCall`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NotRequired, TypedDict

from mcp_types import RequestId

# --- JSON-RPC 2.0 -----------------------------------------------------------------------------


class RpcError(TypedDict):
    """A JSON-RPC `error` member: the proxy's own, or a backend's as the SDK models it."""

    code: int
    message: str
    data: NotRequired[Any]


class RpcRequest(TypedDict):
    """A request the proxy sends a backend. It is built in steps (method and params first, the era's
    stamp, then `jsonrpc`, and `RawCalls.request` sets the `id`), so the two envelope keys are
    not required while it is built: the order of its keys on the wire is the order they were set."""

    method: str
    params: dict[str, Any]
    jsonrpc: NotRequired[Literal["2.0"]]
    id: NotRequired[RequestId]


class RpcNotification(TypedDict):
    """A notification the proxy sends (`notifications/cancelled` to a backend)."""

    jsonrpc: Literal["2.0"]
    method: str
    params: dict[str, Any]


class RpcResult(TypedDict):
    """A successful response the proxy writes to its client."""

    jsonrpc: Literal["2.0"]
    id: RequestId
    result: dict[str, Any]


class RpcErrorResponse(TypedDict):
    """An error response the proxy writes to its client (or to no one: `id` may be null)."""

    jsonrpc: Literal["2.0"]
    id: RequestId | None
    error: RpcError


RpcResponse = RpcResult | RpcErrorResponse


class CancelledParams(TypedDict):
    """The params of `notifications/cancelled` the proxy sends about a request of its own."""

    requestId: RequestId


# The `data` of a proxy error about a call that reached the gate; the keys are `results.CALL_META`
# and `results.FIRST_META` (not identifiers, hence the functional form).
CallErrorData = TypedDict(
    "CallErrorData",
    {"mcp-spec-proxy/call": str, "mcp-spec-proxy/first-call": str},
    total=False,
)


# --- The OpenAI chat-completions wire ---------------------------------------------------------


class FunctionDefinition(TypedDict):
    """A tool's `function` as the proxy offers it to a model: its name, description and JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]


class ToolDefinition(TypedDict):
    """A tool in chat-completions form (`prompts.openai_tool`, the engine's `final_answer`)."""

    type: Literal["function"]
    function: FunctionDefinition


class JsonSchemaFormat(TypedDict):
    name: str
    schema: dict[str, Any]
    strict: bool


class ResponseFormat(TypedDict):
    """The `response_format` the proxy asks a model for: a JSON schema (a verdict, a JSON action)."""

    type: Literal["json_schema"]
    json_schema: JsonSchemaFormat


class FunctionCall(TypedDict):
    """A tool call's `function`: its name and its arguments as a JSON string."""

    name: str
    arguments: str


class ToolCall(TypedDict):
    """One entry of an assistant message's `tool_calls`."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(TypedDict):
    """The assistant message of a completion the proxy answers with (the gateway, the scripted model)."""

    role: Literal["assistant"]
    content: str | None
    tool_calls: NotRequired[list[ToolCall]]
    reasoning_content: NotRequired[str]


class PromptTokensDetails(TypedDict):
    cached_tokens: int


class CompletionTokensDetails(TypedDict):
    reasoning_tokens: int


class Usage(TypedDict):
    """A completion's token counts, as the gateway sums them over the run's model calls (and the
    scripted model server counts them, reasoning included)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: NotRequired[CompletionTokensDetails]


class Choice(TypedDict):
    index: int
    message: AssistantMessage
    finish_reason: str


class ChatCompletion(TypedDict):
    """A non-streamed completion the gateway answers with (and streams cut into chunks)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class FunctionDelta(TypedDict, total=False):
    name: str
    arguments: str  # a piece of the arguments' JSON; the pieces in order make it whole


class ToolCallDelta(TypedDict):
    """A tool call in a stream chunk: its first piece names it (`id`, `type`, the function's name)."""

    index: int
    id: NotRequired[str]
    type: NotRequired[Literal["function"]]
    function: NotRequired[FunctionDelta]


class Delta(TypedDict, total=False):
    """What one stream chunk adds to the assistant message; the last chunk's is empty."""

    role: Literal["assistant"]
    content: str | None
    reasoning_content: str
    tool_calls: list[ToolCallDelta]


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: None
    code: str | None


class ErrorBody(TypedDict):
    """An OpenAI-shaped error body: `{"error": {"message", "type", "param", "code"}}`."""

    error: ErrorDetail


# --- What a reviewer reads (JSON inside the prompt's fences, `prompts.py`) -------------------


class StepJson(TypedDict, total=False):
    """A step as the reviewer reads it (and the `decision` event records it); the keys in this
    order. A step that ran has `observation` and `is_error`; the held one has `status`."""

    step: int  # its number in the segment, where it has one
    tool: str
    arguments: dict[str, Any]
    effect: str
    agent_stated_intent: str  # fenced as the agent's claim
    observation: str  # fenced as the tool's output
    is_error: bool
    status: str


class ToolJson(TypedDict):
    """A tool as the reviewer reads it, inside the tool-definitions fence."""

    name: str
    server: str
    effect: str
    input_schema: Mapping[str, Any]
    description: NotRequired[str]


class Lookalike(TypedDict):
    tool: str
    server: str


class Whose(TypedDict, total=False):
    """Where a step's tool lives: its server and, for the held call, the tools of its name elsewhere."""

    server: str
    lookalikes_on_other_servers: list[Lookalike]


class BlockEntry(Whose, total=False):
    """One step of the block that lists a segment's steps by number for the verdict."""

    step: int
    tool: str
    status: str


__all__ = [
    "AssistantMessage",
    "BlockEntry",
    "CallErrorData",
    "CancelledParams",
    "ChatCompletion",
    "Choice",
    "CompletionTokensDetails",
    "Delta",
    "ErrorBody",
    "ErrorDetail",
    "FunctionCall",
    "FunctionDefinition",
    "FunctionDelta",
    "JsonSchemaFormat",
    "Lookalike",
    "PromptTokensDetails",
    "ResponseFormat",
    "RpcError",
    "RpcErrorResponse",
    "RpcNotification",
    "RpcRequest",
    "RpcResponse",
    "RpcResult",
    "StepJson",
    "ToolCall",
    "ToolCallDelta",
    "ToolDefinition",
    "ToolJson",
    "Usage",
    "Whose",
]
