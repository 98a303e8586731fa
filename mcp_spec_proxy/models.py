"""OpenAI-compatible chat models: the weak and strong models of the configuration.

Any server that speaks `/v1/chat/completions` (OpenAI, vLLM, SGLang, llama.cpp, Ollama, LM
Studio …) is reached through the official `openai` client. What a request carries — how thinking
is switched, native tools or JSON actions, where hidden states come from — is the model's
provider profile (`mcp_spec_proxy.config.providers`, where `ModelConfig` lives). With `actions: json`
the tools become a JSON-schema `response_format` and the reply is parsed back into the same
`tool_calls`/content shape (`mcp_spec_proxy.actions`), so callers never see the difference. A
JSON action cut off at max_tokens, or one that does not parse, is `Completion.action_error` (the
engine shows it to the model as a failed step; the run goes on within its limits).

A `ChatModel` records every call: prompt, completion and cached tokens, and latency. Failures
surface as `ModelError` with the endpoint and what went wrong; the caller decides what a failure
means (the barrier fails closed).
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from mcp_spec_proxy.actions import ToolCall, action_format, action_messages, parse_action, shorten
from mcp_spec_proxy.config.providers import PROVIDERS, Actions, HiddenStates, ModelConfig, Provider, detect_provider
from mcp_spec_proxy.errors import ProxyError
from mcp_spec_proxy.trajectory import Representation
from mcp_spec_proxy.wire_types import ResponseFormat

# Names that lived here before the split, still importable from `mcp_spec_proxy.models`.
__all__ = [
    "PROVIDERS",
    "Actions",
    "ChatModel",
    "Completion",
    "HiddenStates",
    "ModelCall",
    "ModelConfig",
    "ModelError",
    "Provider",
    "Purpose",
    "ToolCall",
    "action_format",
    "action_messages",
    "detect_provider",
]

Purpose = Literal["verify", "repair", "draft", "answer"]


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
    # When it was recorded (epoch ns): its end, from which a trace draws its span back by `latency_s`.
    at_ns: int = field(default_factory=time.time_ns, compare=False)

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
class Completion:
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    call: ModelCall
    reasoning: str | None = None
    # One final-layer vector per drafted step (per tool call, or one for an answer) when asked for
    # with `hidden_states=True` and the server returns them (`hidden_states: native`); else ().
    hidden_states: tuple[list[float], ...] = ()
    action_error: str | None = None  # a JSON action that did not parse: what was wrong (content: its text)
    # What each of hidden_states is: the call's own state, or the turn's standing in (`trajectory.Representation`).
    state_kinds: tuple[Representation, ...] = ()
    finish_reason: str | None = None  # "length": the answer was cut off at max_tokens


@dataclass
class ChatModel:
    """A configured endpoint under a role name (`weak`, `strong`)."""

    role: str
    config: ModelConfig
    api_key: str | None = None
    calls: list[ModelCall] = field(default_factory=list)  # every call, for telemetry and figures

    def __post_init__(self) -> None:
        import openai  # here, not at the top: a proxy without models never pays for the client (~0.3 s)

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
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | None = None,
        response_format: ResponseFormat | None = None,
        hidden_states: bool = False,
        max_tokens: int | None = None,
        tools_defined: bool = False,
    ) -> Completion:
        """One chat completion. With `tools` and `actions: json`, the tools become a JSON-schema
        `response_format` and the answer is parsed back into `tool_calls` (see the module
        docstring). `hidden_states` asks for one vector per drafted step (LEASH's `hidden` encoder) in
        the same request, where the server returns them (`hidden_states: native`); it never makes
        another request (`call_states` says what each vector is). `tools_defined`: the messages
        define the tools and are another request's prefix (the repair turn's): a JSON-action guide
        then comes after them (`action_messages(defined=True)`)."""
        import openai  # loaded by __post_init__; its exception classes are named below

        extra = _merge(self.config.extra_body, self.config.thinking_on if thinking else self.config.thinking_off)
        json_actions = bool(tools) and self.config.actions == "json"
        if json_actions:
            assert tools is not None
            messages = action_messages(messages, tools, answers=tool_choice != "required", defined=tools_defined)
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
            raise self._failed(purpose, started, f"HTTP {exc.status_code}: {shorten(exc.message)}") from None
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
            if json_actions and getattr(choice, "finish_reason", None) == "length":
                # A failed step the model sees (the run goes on, bounded by its limits), not the run's end.
                answer: str | None = None
                tool_calls: tuple[ToolCall, ...] = ()
                action_error = (
                    f"the JSON action was cut off at the token limit ({call.completion_tokens} tokens:"
                    f" {shorten(repr(content), 120)}): make a shorter call, or raise max_tokens"
                )
            elif json_actions:
                answer, tool_calls, action_error = parse_action(content)
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
        kinds: tuple[Representation, ...] = ()
        if hidden_states and self.config.hidden_states == "native":
            raw = (getattr(choice, "model_extra", None) or {}).get("hidden_states")
            states, kinds = call_states(raw, max(1, len(tool_calls)))
        return Completion(
            content,
            tool_calls,
            call,
            reasoning if isinstance(reasoning, str) else None,
            states,
            action_error,
            kinds,
            finish if isinstance(finish := getattr(choice, "finish_reason", None), str) else None,
        )

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
        raise _Malformed(f"answered tool_calls that is not a list: {shorten(repr(raw), 80)}")
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
                f"answered tool call {index} with no function name (function: {shorten(repr(function), 80)})"
            )
        if arguments is not None and not isinstance(arguments, str):
            raise _Malformed(f"answered tool call {index} ({name}) with arguments that are not JSON text")
        call_id = getattr(call, "id", None)
        calls.append(ToolCall(name, arguments or "{}", call_id if isinstance(call_id, str) else ""))
    return tuple(calls)


def call_states(values: Any, calls: int) -> tuple[tuple[list[float], ...], tuple[Representation, ...]]:
    """One state per call of a turn from SGLang's `hidden_states`, and what each one is.

    SGLang's chat API answers the turn's last generated token's state (one vector; its native
    /generate answers a list per token, the prompt's block first): that is the state at the last
    call's own last token, and it stands in (`turn`) for the turn's earlier calls, which it cannot
    tell apart. A server that reports the state at each call's last token answers one vector per
    call, in call order (`call` each) — a list of exactly `calls` vectors of one size; a turn's
    per-token list is never that short, since every call takes more than one token.
    """
    if (
        calls > 1
        and isinstance(values, list)
        and len(values) == calls
        and all(_flat(v) for v in values)
        and len({len(v) for v in values}) == 1
    ):
        own: list[Representation] = ["call"] * calls
        return tuple([float(x) for x in v] for v in values), tuple(own)
    vector = _last_vector(values)
    if vector is None:
        return (), ()
    kinds: list[Representation] = ["turn"] * (calls - 1)
    return (vector,) * calls, (*kinds, "call")


def _flat(values: Any) -> bool:
    return (
        isinstance(values, list)
        and bool(values)
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values)
    )


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
