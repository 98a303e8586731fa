"""Provider profiles and `ModelConfig`: what each OpenAI-compatible server's requests carry.

Any server that speaks `/v1/chat/completions` (OpenAI, vLLM, SGLang, llama.cpp, Ollama, LM
Studio …) is reached the same way, but the servers differ in how thinking is switched, how a
drafting model acts, and where its hidden states come from. A model's **provider profile**
(`provider:`) supplies those defaults:

    profile   thinking off / on                          actions  hidden states
    openai    nothing (set thinking_off/on yourself)     tools    none
    vllm      chat_template_kwargs.enable_thinking       tools    none
    sglang    chat_template_kwargs.enable_thinking       tools    return_hidden_states (same request)
    llamacpp  chat_template_kwargs.enable_thinking       json     none
    ollama    reasoning_effort: none / (model default)   json     none

Only SGLang returns a drafting call's own states. Where a server has none, LEASH's `hidden`
encoder says so at start-up and encodes with its fallback (`leash.embedding`, else hashing) — never
with another request to the weak model's server, which costs a forward pass and, on llama.cpp,
evicts the draft's prefix cache (`hidden_states: embeddings`, which did that, is gone).

`provider: auto` (the default) picks `openai` for api.openai.com, `ollama` for port 11434, and
otherwise `vllm`, the generic self-hosted profile; SGLang and llama.cpp are never guessed (their
ports are not distinctive), so name them. A field written in servers.yaml always wins over the
profile's default. (`actions` are explained in `mcp_spec_proxy.actions`.)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, model_validator

Provider = Literal["openai", "vllm", "sglang", "llamacpp", "ollama"]
PROVIDERS: tuple[Provider, ...] = ("openai", "vllm", "sglang", "llamacpp", "ollama")
Actions = Literal["tools", "json"]
HiddenStates = Literal["native", "none"]

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
    "vllm": Profile(_THINKING_KWARGS_OFF, _THINKING_KWARGS_ON, "tools", "none"),
    "sglang": Profile(_THINKING_KWARGS_OFF, _THINKING_KWARGS_ON, "tools", "native"),
    # llama.cpp reads per-request chat_template_kwargs; its json_schema grammar beats its tool parsers.
    "llamacpp": Profile(_THINKING_KWARGS_OFF, _THINKING_KWARGS_ON, "json", "none"),
    # Ollama's /v1 turns thinking off only with reasoning_effort "none"; asking a model that cannot
    # think to think is an error there, so thinking on is left to the model's default.
    "ollama": Profile({"reasoning_effort": "none"}, {}, "json", "none"),
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
        """Names where this model's hidden states come from, for a bank to record."""
        if self.hidden_states == "native":
            return f"{self.model} (return_hidden_states)"
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
        if data.get("hidden_states") == "embeddings":
            raise ValueError(
                "hidden_states: embeddings is no longer offered: it was an extra forward pass on the weak model's"
                " server (on llama.cpp it evicted the draft's prefix cache) — remove it; LEASH's hidden encoder"
                " falls back to leash.embedding (a separate endpoint) or hashing where a server has no states"
            )
        for key in ("thinking_off", "thinking_on", "actions", "hidden_states"):
            if data.get(key) is None:
                data[key] = copy.deepcopy(getattr(profile, key))
        return data
