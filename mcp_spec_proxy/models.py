"""OpenAI-compatible chat models: the weak and strong models of the configuration.

Any server that speaks `/v1/chat/completions` (OpenAI, vLLM, SGLang, Ollama, LM Studio …) is
reached through the official `openai` client. A `ChatModel` knows how to switch thinking off
(verification) and on (repair) for its server — `chat_template_kwargs` for Qwen-style templates
on vLLM/SGLang, `reasoning_effort` for OpenAI-style reasoning models — and records every call:
prompt, completion and cached tokens, and latency. Failures surface as `ModelError` with the
endpoint and what went wrong; the caller decides what a failure means (the barrier fails
closed).
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import openai
from pydantic import BaseModel, ConfigDict, Field

from mcp_spec_proxy.errors import ProxyError

Purpose = Literal["verify", "repair", "draft", "answer"]


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
    # Merged into extra_body (request keys for reasoning_effort) to switch thinking off / on.
    thinking_off: dict[str, Any] = Field(default_factory=lambda: {"chat_template_kwargs": {"enable_thinking": False}})
    thinking_on: dict[str, Any] = Field(default_factory=lambda: {"chat_template_kwargs": {"enable_thinking": True}})


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
    hidden_state: Any = None  # SGLang `choices[0].hidden_states` when asked for (LEASH's `hidden` encoder)


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
    ) -> Completion:
        extra = _merge(self.config.extra_body, self.config.thinking_on if thinking else self.config.thinking_off)
        kwargs: dict[str, Any] = {"model": self.config.model, "messages": messages}
        # OpenAI-style reasoning knobs are top-level request fields, not extra body.
        if "reasoning_effort" in extra:
            kwargs["reasoning_effort"] = extra.pop("reasoning_effort")
        if tools:
            kwargs["tools"] = tools
            if tool_choice:
                kwargs["tool_choice"] = tool_choice
        if response_format is not None:
            kwargs["response_format"] = response_format
        if self.config.temperature is not None:
            kwargs["temperature"] = self.config.temperature
        if self.config.max_tokens is not None:
            kwargs["max_tokens"] = self.config.max_tokens
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
        try:
            if message is None:
                raise _Malformed("answered a choice with no message")
            tool_calls = _tool_calls(getattr(message, "tool_calls", None))
        except _Malformed as exc:
            failed = replace(call, ok=False, error=str(exc))
            self.calls.append(failed)
            raise ModelError(
                f"{self.role} model {self.config.model!r} at {self.config.base_url} {exc}", failed
            ) from None
        self.calls.append(call)
        content = getattr(message, "content", None)
        reasoning = getattr(message, "reasoning_content", None)
        hidden = (choice.model_extra or {}).get("hidden_states") if hasattr(choice, "model_extra") else None
        return Completion(
            content if isinstance(content, str) else None,
            tool_calls,
            call,
            reasoning if isinstance(reasoning, str) else None,
            hidden,
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
