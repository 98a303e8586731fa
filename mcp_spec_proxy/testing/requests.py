"""What the scripted model server receives: typed, validated views of request bodies.

`ChatRequest.from_body` and `EmbeddingRequest.from_body` accept exactly what the OpenAI wire
format allows here and raise `InvalidChatRequest` / `InvalidEmbeddingRequest` (answered 400)
with a message saying what is wrong; `ReceivedRequest` is any request as it arrived.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mcp_spec_proxy.testing.errors import InvalidChatRequest, InvalidEmbeddingRequest

# Request fields ChatRequest names; the rest go to `extra`.
_KNOWN_FIELDS = frozenset(("model", "messages", "tools", "response_format", "stream", "stream_options"))
_KNOWN_FIELDS |= {"chat_template_kwargs", "reasoning_effort"}


@dataclass(frozen=True)
class ChatRequest:
    """A typed view of a chat-completions request body.

    `extra` holds every top-level field not named here (temperature, max_tokens, tool_choice...);
    `raw` is the whole body as received.
    """

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    response_format: dict[str, Any] | None = None
    stream: bool = False
    include_usage: bool = False
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_effort: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: object) -> ChatRequest:
        """Validate a parsed JSON body; raises `InvalidChatRequest` saying what is wrong."""
        if not isinstance(body, dict):
            raise InvalidChatRequest(f"request body must be a JSON object, got {type(body).__name__}")
        model = body.get("model")
        if not isinstance(model, str):
            raise InvalidChatRequest("'model' is required and must be a string")
        stream = body.get("stream") or False
        if not isinstance(stream, bool):
            raise InvalidChatRequest("'stream' must be a boolean")
        stream_options = _optional_dict(body, "stream_options") or {}
        reasoning_effort = body.get("reasoning_effort")
        if reasoning_effort is not None and not isinstance(reasoning_effort, str):
            raise InvalidChatRequest("'reasoning_effort' must be a string")
        return cls(
            model=model,
            messages=_list_of_dicts(body, "messages", required=True),
            tools=_list_of_dicts(body, "tools", required=False),
            response_format=_optional_dict(body, "response_format"),
            stream=stream,
            include_usage=bool(stream_options.get("include_usage")),
            chat_template_kwargs=_optional_dict(body, "chat_template_kwargs") or {},
            reasoning_effort=reasoning_effort,
            extra={k: v for k, v in body.items() if k not in _KNOWN_FIELDS},
            raw=body,
        )

    @property
    def json_schema(self) -> dict[str, Any] | None:
        """The `json_schema` object of a `response_format` of that type, else None."""
        rf = self.response_format
        if rf is None or rf.get("type") != "json_schema":
            return None
        schema = rf.get("json_schema")
        return schema if isinstance(schema, dict) else None

    @property
    def wants_hidden_states(self) -> bool:
        """The request asks for SGLang's `return_hidden_states`."""
        return self.raw.get("return_hidden_states") is True

    @property
    def last_user_text(self) -> str:
        """The text of the last user message (text parts joined), or "" when there is none."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return _text_of(message.get("content"))
        return ""


def _list_of_dicts(body: dict[str, Any], key: str, *, required: bool) -> list[dict[str, Any]]:
    value = body.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise InvalidChatRequest(f"'{key}' must be a list of objects")
    return value


def _optional_dict(body: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = body.get(key)
    if value is not None and not isinstance(value, dict):
        raise InvalidChatRequest(f"'{key}' must be an object")
    return value


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


@dataclass(frozen=True)
class ReceivedRequest:
    """One HTTP request as received; `body` is the parsed JSON, None for GET or a body that is not JSON."""

    method: str
    path: str
    body: Any


@dataclass(frozen=True)
class EmbeddingRequest:
    """A typed view of an embeddings request body; `input` is always a list of strings."""

    model: str
    input: list[str]
    encoding_format: str = "float"
    dimensions: int | None = None
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: object) -> EmbeddingRequest:
        """Validate a parsed JSON body; raises `InvalidEmbeddingRequest` saying what is wrong."""
        if not isinstance(body, dict):
            raise InvalidEmbeddingRequest(f"request body must be a JSON object, got {type(body).__name__}")
        model = body.get("model")
        if not isinstance(model, str):
            raise InvalidEmbeddingRequest("'model' is required and must be a string")
        value = body.get("input")
        inputs = [value] if isinstance(value, str) else value
        if not isinstance(inputs, list) or not inputs or not all(isinstance(item, str) for item in inputs):
            raise InvalidEmbeddingRequest(
                "'input' must be a string or a non-empty list of strings (token arrays are not supported here)"
            )
        if any(item == "" for item in inputs):
            raise InvalidEmbeddingRequest("'input' cannot contain an empty string")
        encoding_format = body.get("encoding_format") or "float"
        if encoding_format not in ("float", "base64"):
            raise InvalidEmbeddingRequest(f"'encoding_format' must be 'float' or 'base64', got {encoding_format!r}")
        dimensions = body.get("dimensions")
        if dimensions is not None and (
            not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1
        ):
            raise InvalidEmbeddingRequest("'dimensions' must be a positive integer")
        return cls(model, inputs, encoding_format, dimensions, body)
