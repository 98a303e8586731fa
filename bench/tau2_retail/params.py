"""The benchmark's parameters: `bench.toml` beside this module, overridden by a file of the same shape.

`load(path)` reads the defaults, merges `path` over them key by key (a table replaces only the
keys it names) and validates the result; an unknown key or a value out of range is a
`ParamsError` naming the key. `lines(params)` lists every value in force, for the report.
"""

from __future__ import annotations

import math
import random
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mcp_spec_proxy.engine import MODES, Mode

DEFAULTS = "bench.toml"


class ParamsError(ValueError):
    """A parameter file that cannot be read, or holds an unknown key or a value out of range."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Lengths(_Strict):
    """A lognormal token count with the given arithmetic mean; a mean of 0 means no text at all."""

    mean: float = Field(ge=0)
    sigma: float = Field(ge=0, le=3)

    def draw(self, rng: random.Random) -> int:
        if self.mean <= 0:
            return 0
        mu = math.log(self.mean) - self.sigma**2 / 2  # so that the mean is `mean`
        return max(1, round(rng.lognormvariate(mu, self.sigma)))


class Run(_Strict):
    modes: list[Mode] = Field(min_length=1)
    trials: int = Field(ge=1)
    seed: int
    concurrency: int = Field(ge=1, le=16)
    warmup: bool
    draft_steps: int = Field(ge=1, le=64)
    max_steps: int = Field(ge=1)
    answer_graded: bool
    review_policy: bool
    task_text: Literal["instruction", "instruction+known_info"]


class Author(_Strict):
    error_rate: float = Field(ge=0, le=1)
    reasoning_tokens: Lengths


class Strong(Author):
    repair_reasoning_tokens: Lengths


class Errors(_Strict):
    read: dict[Literal["wrong_record", "premature_write", "early_answer"], float]
    write: dict[Literal["wrong_record", "wrong_tool", "early_answer"], float]


class Verifier(_Strict):
    recall: float = Field(ge=0, le=1)
    false_reject: float = Field(ge=0, le=1)
    replacement: float = Field(ge=0, le=1)
    accept_reason_tokens: Lengths
    reject_reason_tokens: Lengths


class Repair(_Strict):
    success: float = Field(ge=0, le=1)


class Answer(_Strict):
    tokens: Lengths


class Endpoints(_Strict):
    weak_api_key_env: str
    strong_api_key_env: str


class Params(_Strict):
    run: Run
    weak: Author
    strong: Strong
    errors: Errors
    verifier: Verifier
    repair: Repair
    answer: Answer
    endpoints: Endpoints


def load(path: Path | None = None) -> Params:
    """The defaults, with `path` (TOML) merged over them."""
    text = (resources.files(__package__ or "bench.tau2_retail") / DEFAULTS).read_text(encoding="utf-8")
    data = tomllib.loads(text)
    if path is not None:
        try:
            override = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ParamsError(f"{path}: cannot read it as TOML: {exc}") from None
        data = merge(data, override)
    try:
        return Params.model_validate(data)
    except ValidationError as exc:
        where = str(path) if path is not None else DEFAULTS
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:5])
        raise ParamsError(f"{where}: {problems}") from None


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` over `base`: tables merge key by key, anything else replaces."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and key not in ("read", "write"):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


# What a run with endpoints uses; the other sections drive the scripted agents only (agents.py, authors.py).
ENDPOINT_SECTIONS = ("run", "endpoints")


def lines(params: Params, sections: tuple[str, ...] | None = None) -> list[str]:
    """Every parameter in force (of `sections`, if given) as `section.key = value`, in file order."""
    out = []
    for section, table in params.model_dump(mode="json").items():
        if sections is not None and section not in sections:
            continue
        for key, value in table.items():
            out.append(f"{section}.{key} = {value}")
    return out


__all__ = ["ENDPOINT_SECTIONS", "MODES", "Lengths", "Params", "ParamsError", "lines", "load", "merge"]
