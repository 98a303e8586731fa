"""Modelled cost of model calls: wall time and HBM traffic from token counts.

A benchmark that runs scripted models knows what each call would cost in tokens (prompt,
cached prefix, decoded) but not in time on real accelerators. This module turns the tokens into
MODELLED seconds and bytes read from HBM with a stated, deliberately simple model, one
`ModelCost` per role (weak, strong):

    seconds(call) = prefill: per forward pass of at most `prefill_chunk_tokens` uncached
                    tokens, max(tokens / prefill_tps, weight bytes the pass touches / HBM B/s)
                  + decode:  decode tokens / decode_tps            (batch 1)
    HBM(call)     = prefill: weight bytes per pass + KV bytes * (uncached written + prompt read)
                  + decode:  per token, active weight bytes + KV bytes * its context

Cached prefix tokens cost no prefill compute. For a mixture of experts, a decoded token reads the
always-active weights and its share of the routed experts; a prefill pass over T tokens touches
each expert with probability 1 - (1 - k/E)^T, which is all of them for any real prompt. Decode
time does not grow with context (at the few thousand tokens of these tasks the KV read is small
next to the weights); the HBM count does include it.

The defaults (`cost_model.toml` beside this module) describe the SpecAgent paper's setting, a 4B
dense weak model and a 397B-total / 17B-active MoE strong model on H20-class GPUs; every number
there carries its derivation. They are modelled, not measured. `load(path)` reads another file
of the same shape (TOML or JSON) in their place.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

DEFAULTS = "cost_model.toml"
ROLES = ("weak", "strong")
_MODEL_KEYS = (
    "gpus",
    "total_params",
    "active_params",
    "routed_fraction",
    "bytes_per_param",
    "kv_bytes_per_token",
    "hbm_bytes_per_s",
    "decode_tps",
    "prefill_tps",
)


class CostModelError(ValueError):
    """A cost-model file that is missing a number, has an unknown one, or one out of range."""


class TokenCounts(Protocol):
    """What one model call cost in tokens (`mcp_spec_proxy.models.ModelCall` is one)."""

    @property
    def role(self) -> str: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...


@dataclass(frozen=True)
class Parameter:
    """One number of the cost model and how it was arrived at."""

    value: float
    why: str


@dataclass(frozen=True)
class Cost:
    """Modelled cost of one or more calls; adds up."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    hbm_bytes: float = 0.0

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.decode_s

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.prefill_s + other.prefill_s, self.decode_s + other.decode_s, self.hbm_bytes + other.hbm_bytes)


@dataclass(frozen=True)
class ModelCost:
    """Throughputs and bytes of one model as deployed."""

    name: str
    prefill_tps: float
    decode_tps: float
    dense_bytes: float  # weights every forward pass reads (attention, shared experts, embeddings)
    routed_bytes: float  # all routed experts' weights together; 0 for a dense model
    routed_fraction: float  # experts per token / experts
    kv_bytes_per_token: float
    hbm_bytes_per_s: float
    prefill_chunk_tokens: int = 8192

    @property
    def decode_weight_bytes(self) -> float:
        """Weight bytes one decoded token reads (≈ active parameters * bytes per parameter)."""
        return self.dense_bytes + self.routed_bytes * self.routed_fraction

    def pass_weight_bytes(self, tokens: int) -> float:
        """Weight bytes a prefill pass over `tokens` tokens reads: every expert some token routes to."""
        touched = 1.0 - (1.0 - self.routed_fraction) ** tokens
        return self.dense_bytes + self.routed_bytes * touched

    def call(self, prompt_tokens: int, cached_tokens: int, decode_tokens: int) -> Cost:
        if prompt_tokens <= 0 and decode_tokens <= 0:
            return Cost()  # a failed request: nothing was computed
        uncached = max(prompt_tokens - cached_tokens, 0)
        # A server always computes at least the last prompt token, even on a full cache hit.
        passes = [self.prefill_chunk_tokens] * (max(uncached, 1) // self.prefill_chunk_tokens)
        if max(uncached, 1) % self.prefill_chunk_tokens:
            passes.append(max(uncached, 1) % self.prefill_chunk_tokens)
        prefill_s = sum(max(t / self.prefill_tps, self.pass_weight_bytes(t) / self.hbm_bytes_per_s) for t in passes)
        prefill_bytes = sum(map(self.pass_weight_bytes, passes))
        prefill_bytes += self.kv_bytes_per_token * (uncached + prompt_tokens)
        d = decode_tokens
        decode_bytes = d * self.decode_weight_bytes + self.kv_bytes_per_token * (d * prompt_tokens + d * (d - 1) / 2)
        return Cost(prefill_s, d / self.decode_tps, prefill_bytes + decode_bytes)


@dataclass(frozen=True)
class CostModel:
    """The weak and the strong model's costs, with every number they were built from."""

    weak: ModelCost
    strong: ModelCost
    parameters: tuple[tuple[str, Parameter], ...]
    source: str

    def for_role(self, role: str) -> ModelCost:
        if role == "weak":
            return self.weak
        if role == "strong":
            return self.strong
        raise KeyError(f"no cost model for role {role!r}: expected one of {', '.join(ROLES)}")

    def cost(self, call: TokenCounts) -> Cost:
        return self.for_role(call.role).call(call.prompt_tokens, call.cached_tokens, call.completion_tokens)

    def total(self, calls: list[TokenCounts]) -> Cost:
        return sum((self.cost(c) for c in calls), Cost())


def load(path: Path | None = None) -> CostModel:
    """The cost model in `path` (TOML, or JSON by its suffix), else the shipped defaults."""
    if path is None:
        source = resources.files(__package__ or "bench") / DEFAULTS
        data = tomllib.loads(source.read_text(encoding="utf-8"))
        where = f"{__package__}/{DEFAULTS}"
    else:
        text = path.read_text(encoding="utf-8")
        try:
            data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
            raise CostModelError(f"{path}: not valid {path.suffix.lstrip('.') or 'TOML'}: {exc}") from None
        where = str(path)
    return _parse(data, where)


def _parse(data: dict[str, Any], where: str) -> CostModel:
    unknown = set(data) - {"prefill_chunk_tokens", *ROLES}
    if unknown:
        raise CostModelError(f"{where}: unknown keys {sorted(unknown)}; expected prefill_chunk_tokens, weak, strong")
    parameters: list[tuple[str, Parameter]] = []
    chunk = _parameter(data, "prefill_chunk_tokens", where)
    parameters.append(("prefill_chunk_tokens", chunk))
    models: dict[str, ModelCost] = {}
    for role in ROLES:
        table = data.get(role)
        if not isinstance(table, dict):
            raise CostModelError(f"{where}: missing table [{role}]")
        extra = set(table) - {"name", *_MODEL_KEYS}
        if extra:
            raise CostModelError(f"{where}: [{role}] has unknown keys {sorted(extra)}")
        p = {key: _parameter(table, key, f"{where} [{role}]") for key in _MODEL_KEYS}
        parameters.extend((f"{role}.{key}", value) for key, value in p.items())
        models[role] = _model(str(table.get("name", role)), {k: v.value for k, v in p.items()}, int(chunk.value))
    return CostModel(models["weak"], models["strong"], tuple(parameters), where)


def _parameter(table: dict[str, Any], key: str, where: str) -> Parameter:
    entry = table.get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("value"), int | float) or "why" not in entry:
        raise CostModelError(f'{where}: {key} must be {{ value = <number>, why = "<derivation>" }}')
    value = float(entry["value"])
    if value < 0 or not math.isfinite(value):
        raise CostModelError(f"{where}: {key} = {value} must be a finite number ≥ 0")
    return Parameter(value, str(entry["why"]))


def _model(name: str, v: dict[str, float], chunk: int) -> ModelCost:
    total, active, f, width = v["total_params"], v["active_params"], v["routed_fraction"], v["bytes_per_param"]
    if not 0 <= f < 1 or active > total or (f == 0 and active != total):
        raise CostModelError(
            f"{name}: routed_fraction {f}, total {total:g} and active {active:g} parameters do not fit: a dense "
            "model has routed_fraction 0 and active = total; an MoE has 0 < routed_fraction < 1"
        )
    for key in ("decode_tps", "prefill_tps", "hbm_bytes_per_s"):
        if v[key] <= 0:
            raise CostModelError(f"{name}: {key} must be > 0")
    # active = dense + routed * f and total = dense + routed, solved for the two parts.
    dense = (active - total * f) / (1 - f)
    if dense < 0:
        raise CostModelError(f"{name}: {active:g} active of {total:g} is less than routed_fraction {f} implies")
    return ModelCost(
        name=name,
        prefill_tps=v["prefill_tps"],
        decode_tps=v["decode_tps"],
        dense_bytes=dense * width,
        routed_bytes=(total - dense) * width,
        routed_fraction=f,
        kv_bytes_per_token=v["kv_bytes_per_token"],
        hbm_bytes_per_s=v["hbm_bytes_per_s"],
        prefill_chunk_tokens=max(chunk, 1),
    )


__all__ = ["Cost", "CostModel", "CostModelError", "ModelCost", "Parameter", "TokenCounts", "load"]
