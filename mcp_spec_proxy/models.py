"""OpenAI-compatible chat models: the weak and strong models of the configuration.

Any server that speaks `/v1/chat/completions` (OpenAI, vLLM, SGLang, llama.cpp, Ollama, LM
Studio …) is reached through the official `openai` client. A model's **provider profile**
(`provider:`) decides what its requests carry, because the servers differ:

    profile   thinking off / on                          actions  hidden states
    openai    nothing (set thinking_off/on yourself)     tools    none
    vllm      chat_template_kwargs.enable_thinking       tools    /v1/embeddings of the same model
    sglang    chat_template_kwargs.enable_thinking       tools    return_hidden_states (same request)
    llamacpp  chat_template_kwargs.enable_thinking       json     /v1/embeddings of the same model
    ollama    reasoning_effort: none / (model default)   json     /v1/embeddings of the same model

`provider: auto` (the default) picks `openai` for api.openai.com, `ollama` for port 11434, and
otherwise `vllm`, the generic self-hosted profile; SGLang and llama.cpp are never guessed (their
ports are not distinctive), so name them. **Actions** are how a drafting model acts: `tools`
sends native `tools`; `json` describes the tools in the system prompt and asks for one JSON
object by `response_format` json_schema — the anyOf of `{tool: const name, arguments: its input
schema}` per tool and `{answer: string}` — which grammar-constrained local servers follow far
better than their tool-call parsers; the answer comes back in the same `tool_calls`/content
shape, so callers never see the difference. A JSON action cut off at max_tokens is a
`ModelError`; one that does not parse is `Completion.action_error` (the engine shows it to the
model as a failed step).

A `ChatModel` records every call: prompt, completion and cached tokens, and latency. Failures
surface as `ModelError` with the endpoint and what went wrong; the caller decides what a failure
means (the barrier fails closed).
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import urlsplit

import openai
from pydantic import BaseModel, ConfigDict, Field, model_validator

from mcp_spec_proxy.errors import ProxyError

Purpose = Literal["verify", "repair", "draft", "answer", "hidden"]
Provider = Literal["openai", "vllm", "sglang", "llamacpp", "ollama"]
PROVIDERS: tuple[Provider, ...] = ("openai", "vllm", "sglang", "llamacpp", "ollama")
Actions = Literal["tools", "json"]
HiddenStates = Literal["native", "embeddings", "none"]

_THINKING_KWARGS_OFF: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": False}}
_THINKING_KWARGS_ON: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": True}}


@dataclass(frozen=True)
class Profile:
    """What a provider's server understands; the defaults of a `ModelConfig` naming it."""

    thinking_off: dict[str, Any]
    thinking_on: dict[str, Any]
    actions: Actions
    hidden_states: HiddenStates


PROFILES: dict[Provider, Profile] = {
    # OpenAI rejects unknown request fields, and reasoning_effort errors on non-reasoning models.
    "openai": Profile({}, {}, "tools", "none"),
    "vllm": Profile(_THINKING_KWARGS_OFF, _THINKING_KWARGS_ON, "tools", "embeddings"),
    "sglang": Profile(_THINKING_KWARGS_OFF, _THINKING_KWARGS_ON, "tools", "native"),
    # llama.cpp reads per-request chat_template_kwargs; its json_schema grammar beats its tool parsers.
    "llamacpp": Profile(_THINKING_KWARGS_OFF, _THINKING_KWARGS_ON, "json", "embeddings"),
    # Ollama's /v1 turns thinking off only with reasoning_effort "none"; asking a model that cannot
    # think to think is an error there, so thinking on is left to the model's default.
    "ollama": Profile({"reasoning_effort": "none"}, {}, "json", "embeddings"),
}


def detect_provider(base_url: str) -> Provider:
    """`provider: auto`: only what the URL says for certain; everything else is the generic `vllm`."""
    try:
        parts = urlsplit(base_url)
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:
        return "vllm"
    if host == "api.openai.com":
        return "openai"
    if port == 11434:  # Ollama's own port
        return "ollama"
    return "vllm"


class ModelConfig(BaseModel):
    """One endpoint, as written under `models:` in servers.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str
    model: str
    api_key_env: str | None = None
    timeout: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=1, ge=0, le=10)
    temperature: float | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    # `auto` (or unset) becomes the detected provider; the fields below default to its `Profile`.
    provider: Provider = "vllm"
    # Merged into extra_body (request keys for reasoning_effort) to switch thinking off / on.
    thinking_off: dict[str, Any] = Field(default_factory=dict)
    thinking_on: dict[str, Any] = Field(default_factory=dict)
    actions: Actions = "tools"  # how a model given tools acts: native tool calls, or one JSON object
    hidden_states: HiddenStates = "none"  # where LEASH's `hidden` encoder gets this model's states

    @property
    def hidden_state_source(self) -> str:
        """Names where this model's hidden states come from, for a bank to record: vectors from
        SGLang's return_hidden_states and from /v1/embeddings are different spaces."""
        if self.hidden_states == "native":
            return f"{self.model} (return_hidden_states)"
        if self.hidden_states == "embeddings":
            return f"{self.model} (/v1/embeddings)"
        return f"{self.model} (none)"

    @model_validator(mode="before")
    @classmethod
    def _profile_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        provider = data.get("provider", "auto")
        if provider in (None, "auto"):
            provider = data["provider"] = detect_provider(str(data.get("base_url", "")))
        profile = PROFILES.get(provider)
        if profile is None:
            return data  # the field's own validation names the allowed values
        for key in ("thinking_off", "thinking_on", "actions", "hidden_states"):
            if data.get(key) is None:
                data[key] = copy.deepcopy(getattr(profile, key))
        return data


class ModelError(ProxyError):
    """A model call failed: timeout, HTTP error, or an answer that is not a chat completion."""

    def __init__(self, message: str, call: ModelCall | None = None) -> None:
        super().__init__(message)
        self.call = call


@dataclass(frozen=True)
class ModelCall:
    """What one request cost."""

    role: str
    purpose: Purpose
    model: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    latency_s: float
    ok: bool = True
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "purpose": self.purpose,
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "latency_ms": round(self.latency_s * 1000, 3),
            "ok": self.ok,
            **({"error": self.error} if self.error else {}),
        }


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # as the model wrote it: JSON text, not yet trusted
    id: str = ""


@dataclass(frozen=True)
class Completion:
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    call: ModelCall
    reasoning: str | None = None
    # One final-layer vector per drafted step (per tool call, or one for an answer) when asked for
    # with `hidden_states=True` and the model has a source (`ModelConfig.hidden_states`); else ().
    hidden_states: tuple[list[float], ...] = ()
    action_error: str | None = None  # a JSON action that did not parse: what was wrong (content: its text)
    state_call: ModelCall | None = None  # the extra /v1/embeddings request that made hidden_states, if any
    finish_reason: str | None = None  # "length": the answer was cut off at max_tokens


@dataclass
class ChatModel:
    """A configured endpoint under a role name (`weak`, `strong`)."""

    role: str
    config: ModelConfig
    api_key: str | None = None
    calls: list[ModelCall] = field(default_factory=list)  # every call, for telemetry and figures

    def __post_init__(self) -> None:
        self._client = openai.AsyncOpenAI(
            base_url=self.config.base_url,
            api_key=self.api_key or "not-needed",
            timeout=self.config.timeout,
            max_retries=self.config.max_retries,
        )

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        purpose: Purpose,
        thinking: bool,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | None = None,
        response_format: dict[str, Any] | None = None,
        hidden_states: bool = False,
        max_tokens: int | None = None,
    ) -> Completion:
        """One chat completion. With `tools` and `actions: json`, the tools become a JSON-schema
        `response_format` and the answer is parsed back into `tool_calls` (see the module
        docstring). `hidden_states` asks for one vector per drafted step (LEASH's `hidden` encoder)."""
        extra = _merge(self.config.extra_body, self.config.thinking_on if thinking else self.config.thinking_off)
        json_actions = bool(tools) and self.config.actions == "json"
        if json_actions:
            assert tools is not None
            messages = action_messages(messages, tools, answers=tool_choice != "required")
            response_format = action_format(tools, answers=tool_choice != "required")
        kwargs: dict[str, Any] = {"model": self.config.model, "messages": messages}
        # OpenAI-style reasoning knobs are top-level request fields, not extra body.
        if "reasoning_effort" in extra:
            kwargs["reasoning_effort"] = extra.pop("reasoning_effort")
        if tools and not json_actions:
            kwargs["tools"] = tools
            if tool_choice:
                kwargs["tool_choice"] = tool_choice
        if response_format is not None:
            kwargs["response_format"] = response_format
        if hidden_states and self.config.hidden_states == "native":
            extra["return_hidden_states"] = True
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        if (max_tokens or self.config.max_tokens) is not None:
            kwargs["max_tokens"] = max_tokens or self.config.max_tokens  # a retry may ask for more room
        started = time.perf_counter()
        try:
            response = await self._client.chat.completions.create(extra_body=extra or None, **kwargs)
        except openai.APITimeoutError:
            raise self._failed(purpose, started, f"timed out after {self.config.timeout:g}s") from None
        except openai.APIStatusError as exc:
            raise self._failed(purpose, started, f"HTTP {exc.status_code}: {_short(exc.message)}") from None
        except openai.APIConnectionError as exc:
            raise self._failed(purpose, started, f"cannot connect: {exc}") from None
        except UnicodeEncodeError as exc:  # before ValueError, its base: the request, not the answer, is at fault
            problem = f"was not asked: the request holds text that is not valid Unicode ({exc.reason})"
            raise self._failed(purpose, started, problem) from None
        except (openai.APIResponseValidationError, ValueError) as exc:
            raise self._failed(purpose, started, f"answered something that is not a chat completion: {exc}") from None
        latency = time.perf_counter() - started
        choices = getattr(response, "choices", None)  # a non-JSON body can come back as a bare str
        if not isinstance(choices, list) or not choices:
            raise self._failed(purpose, started, "answered with no choices")
        # The client builds the answer without validating it: any field below may be null or of the wrong type.
        choice = choices[0]
        message = getattr(choice, "message", None)
        usage = getattr(response, "usage", None)
        details = getattr(usage, "prompt_tokens_details", None)
        call = ModelCall(
            role=self.role,
            purpose=purpose,
            model=self.config.model,
            prompt_tokens=_count(getattr(usage, "prompt_tokens", 0)),
            completion_tokens=_count(getattr(usage, "completion_tokens", 0)),
            cached_tokens=_count(getattr(details, "cached_tokens", 0)),
            latency_s=latency,
        )
        content = getattr(message, "content", None)
        content = content if isinstance(content, str) else None
        action_error: str | None = None
        try:
            if message is None:
                raise _Malformed("answered a choice with no message")
            if json_actions:
                if getattr(choice, "finish_reason", None) == "length":
                    raise _Malformed(
                        f"answered a JSON action cut off at the token limit ({call.completion_tokens} tokens:"
                        f" {_short(repr(content), 120)}) — raise max_tokens"
                    )
                answer, tool_calls, action_error = _parse_action(content)
                content = content if action_error else answer  # a failed action keeps its text for the model
            else:
                tool_calls = _tool_calls(getattr(message, "tool_calls", None))
        except _Malformed as exc:
            failed = replace(call, ok=False, error=str(exc))
            self.calls.append(failed)
            raise ModelError(
                f"{self.role} model {self.config.model!r} at {self.config.base_url} {exc}", failed
            ) from None
        self.calls.append(call)
        reasoning = getattr(message, "reasoning_content", None)
        states: tuple[list[float], ...] = ()
        state_call: ModelCall | None = None
        if hidden_states and action_error is None:
            steps = max(1, len(tool_calls))
            if self.config.hidden_states == "native":
                vector = _last_vector((getattr(choice, "model_extra", None) or {}).get("hidden_states"))
                # SGLang returns the last generated token's state: one per turn, shared by its calls.
                states = (vector,) * steps if vector is not None else ()
            elif self.config.hidden_states == "embeddings":
                texts = [_action_text(c.name, c.arguments) for c in tool_calls] or [json.dumps({"answer": content})]
                states, state_call = await self._embed_states(texts)
        return Completion(
            content,
            tool_calls,
            call,
            reasoning if isinstance(reasoning, str) else None,
            states,
            action_error,
            state_call,
            finish if isinstance(finish := getattr(choice, "finish_reason", None), str) else None,
        )

    async def _embed_states(self, texts: list[str]) -> tuple[tuple[list[float], ...], ModelCall]:
        """The fallback for servers without hidden states: the same model's `/v1/embeddings` of each
        drafted step's text (last-token pooling is the server's setting, e.g. llama.cpp
        `--pooling last`). Advisory: a failure gives no vectors and a failed call, never an error."""
        started = time.perf_counter()
        problem: str | None = None
        vectors: tuple[list[float], ...] = ()
        response: Any = None
        try:
            response = await self._client.embeddings.create(
                model=self.config.model, input=texts, encoding_format="float"
            )
            data = sorted(response.data, key=lambda item: item.index)
            vectors = tuple([float(x) for x in item.embedding] for item in data)
            if len(vectors) != len(texts) or not all(vectors):
                problem, vectors = f"answered {len(vectors)} embeddings for {len(texts)} steps", ()
        except openai.APIStatusError as exc:
            problem = f"embeddings: HTTP {exc.status_code}: {_short(exc.message)}"
        except (openai.APIError, ValueError, TypeError, AttributeError) as exc:
            problem = f"embeddings failed: {_short(str(exc))}"
        usage = getattr(response, "usage", None)
        call = ModelCall(
            self.role,
            "hidden",
            self.config.model,
            _count(getattr(usage, "prompt_tokens", 0)),
            0,
            0,
            time.perf_counter() - started,
            ok=problem is None,
            error=problem,
        )
        self.calls.append(call)
        return vectors, call

    def _failed(self, purpose: Purpose, started: float, problem: str) -> ModelError:
        call = ModelCall(
            self.role, purpose, self.config.model, 0, 0, 0, time.perf_counter() - started, ok=False, error=problem
        )
        self.calls.append(call)
        return ModelError(f"{self.role} model {self.config.model!r} at {self.config.base_url} {problem}", call)

    async def aclose(self) -> None:
        await self._client.close()


class _Malformed(Exception):
    """An answer shaped like a chat completion whose parts are not what the format promises."""


def _tool_calls(raw: Any) -> tuple[ToolCall, ...]:
    """The function calls of an answer; other kinds of call (`custom` …) are skipped.

    A function call without a usable name or arguments is `_Malformed`, never skipped: dropping
    it would turn a tool call into an empty final answer.
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _Malformed(f"answered tool_calls that is not a list: {_short(repr(raw), 80)}")
    calls = []
    for index, call in enumerate(raw):
        if getattr(call, "type", "function") != "function":
            continue
        function = getattr(call, "function", None)
        name = getattr(function, "name", None)
        arguments = getattr(function, "arguments", None)
        if isinstance(arguments, dict):  # a few servers send the arguments as an object, not JSON text
            arguments = json.dumps(arguments, ensure_ascii=False)
        if function is None or not isinstance(name, str) or not name:
            raise _Malformed(
                f"answered tool call {index} with no function name (function: {_short(repr(function), 80)})"
            )
        if arguments is not None and not isinstance(arguments, str):
            raise _Malformed(f"answered tool call {index} ({name}) with arguments that are not JSON text")
        call_id = getattr(call, "id", None)
        calls.append(ToolCall(name, arguments or "{}", call_id if isinstance(call_id, str) else ""))
    return tuple(calls)


# -- JSON actions ------------------------------------------------------------------------------

ACTION_INSTRUCTIONS = """\
You act by replying with exactly one JSON object and nothing else: {"tool": "<tool name>", \
"arguments": {...}} calls one tool with arguments that follow its schema{answer}. The tools:"""


def action_format(tools: list[dict[str, Any]], *, answers: bool = True) -> dict[str, Any]:
    """`response_format` json_schema: one call of an offered tool, or (with `answers`) a final answer."""
    branches: list[dict[str, Any]] = []
    for tool in tools:
        function = tool.get("function") or {}
        schema = function.get("parameters") or {"type": "object"}
        branches.append(
            {
                "type": "object",
                "properties": {"tool": {"const": function.get("name", "")}, "arguments": schema},
                "required": ["tool", "arguments"],
                "additionalProperties": False,
            }
        )
    if answers:
        branches.append(
            {
                "type": "object",
                "properties": {"answer": {"type": "string"}},
                "required": ["answer"],
                "additionalProperties": False,
            }
        )
    return {"type": "json_schema", "json_schema": {"name": "action", "schema": {"anyOf": branches}, "strict": False}}


def action_messages(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, answers: bool = True
) -> list[dict[str, Any]]:
    """The conversation for JSON actions: the tools described in the system prompt (first, so the
    prefix cache keeps serving it), earlier tool calls as the JSON the model writes, and tool
    results as user turns (chat templates without a tool role render them too)."""
    answer = ', or {"answer": "<text>"} gives your final answer and ends the task' if answers else ""
    lines = [ACTION_INSTRUCTIONS.replace("{answer}", answer)]
    for tool in tools:
        function = tool.get("function") or {}
        lines.append(f"- {function.get('name', '')}: {function.get('description') or ''}".rstrip())
        schema = json.dumps(function.get("parameters") or {}, ensure_ascii=False, sort_keys=True)
        lines.append(f"  arguments: {schema}")
    guide = "\n".join(lines)
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            actions = []
            for tool_call in message["tool_calls"]:
                function = tool_call.get("function") or {}
                names[str(tool_call.get("id", ""))] = str(function.get("name", ""))
                actions.append(_action_text(str(function.get("name", "")), function.get("arguments") or "{}"))
            out.append({"role": "assistant", "content": "\n".join(actions)})
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id", "")), "the tool")
            content = message.get("content")
            text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            out.append({"role": "user", "content": f"Result of {name}:\n{text}"})
        else:
            out.append(dict(message))
    if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
        out[0]["content"] = f"{out[0]['content']}\n\n{guide}"
    else:
        out.insert(0, {"role": "system", "content": guide})
    return out


def _action_text(name: str, arguments: str | dict[str, Any]) -> str:
    """A tool call as the JSON action a model writes (also the text embedded for its hidden state)."""
    if isinstance(arguments, str):
        try:
            parsed: Any = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            parsed = arguments
    else:
        parsed = arguments
    return json.dumps({"tool": name, "arguments": parsed}, ensure_ascii=False)


def _parse_action(content: str | None) -> tuple[str | None, tuple[ToolCall, ...], str | None]:
    """A JSON action as (answer, tool calls, error): a call, an answer, or what was wrong with it."""
    text = (content or "").strip()
    if text.startswith("```"):  # a server that did not enforce the schema may fence it
        text = text.strip("`").removeprefix("json").strip()
    try:
        action = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, (), f"the reply is not a JSON action ({exc}): {_short(text, 200)}"
    if isinstance(action, dict) and isinstance(action.get("tool"), str) and action["tool"]:
        arguments = action.get("arguments", {})
        if not isinstance(arguments, dict):
            return None, (), f"the arguments of {action['tool']} are not a JSON object: {_short(text, 200)}"
        return None, (ToolCall(action["tool"], json.dumps(arguments, ensure_ascii=False), "action_1"),), None
    if isinstance(action, dict) and isinstance(action.get("answer"), str):
        return action["answer"], (), None
    return None, (), f'the reply is neither {{"tool", "arguments"}} nor {{"answer"}}: {_short(text, 200)}'


def _last_vector(values: Any) -> list[float] | None:
    """The last token's vector of SGLang's `hidden_states` (one vector, or a list per token)."""
    current = values
    for _ in range(4):
        if not isinstance(current, list) or not current:
            return None
        if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in current):
            return [float(x) for x in current]
        current = current[-1]
    return None


def _count(value: Any) -> int:
    """A token count as reported, or 0 where the server reports none (or nonsense)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
