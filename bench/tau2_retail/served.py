"""What each endpoint says it serves: its `/models`, asked once before a run with endpoints.

The runner sends the model names it was given (`--weak-model` ...), and an OpenAI-compatible server
may answer whatever name it is sent: a stand-in or another checkpoint behind the same port answers
as readily as the model asked for. The report names what each endpoint lists, beside the name asked
for, so that a table made against stand-ins cannot pass for one made against the models.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio
import httpx

from bench.tau2_retail.settings import Endpoints
from mcp_spec_proxy.models import ModelConfig

ASK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Served:
    """One role's endpoint: the model asked for, and what its `/models` lists (or why it said nothing)."""

    asked: str
    base_url: str
    listed: tuple[str, ...] = ()
    problem: str = ""

    def describe(self, role: str) -> str:
        if self.problem:
            return f"{role} {self.asked} (its endpoint did not say what it serves: {self.problem})"
        if self.asked in self.listed:
            return f"{role} {self.asked} (listed by its endpoint)"
        listed = ", ".join(self.listed) or "nothing"
        return f"{role} {self.asked} asked for, but its endpoint lists {listed}: NOT the model named"


async def ask(config: ModelConfig, key: str | None) -> Served:
    """What `config`'s endpoint lists at `/models`."""
    headers = {"authorization": f"Bearer {key}"} if key else {}
    url = config.base_url.rstrip("/") + "/models"
    try:
        async with httpx.AsyncClient(timeout=ASK_TIMEOUT_S) as client:
            answer = await client.get(url, headers=headers)
        answer.raise_for_status()
        listed = tuple(str(model["id"]) for model in answer.json()["data"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        return Served(config.model, config.base_url, problem=f"GET {url}: {type(exc).__name__}")
    return Served(config.model, config.base_url, listed)


async def served_models(endpoints: Endpoints) -> dict[str, Served]:
    """Each role's endpoint (weak, strong, user), asked at the same time."""
    roles = {
        "weak": (endpoints.weak, endpoints.weak_key),
        "strong": (endpoints.strong, endpoints.strong_key),
        "user": (endpoints.user, endpoints.user_key) if endpoints.user else (endpoints.strong, endpoints.strong_key),
    }
    found: dict[str, Served] = {}

    async def one(role: str, config: ModelConfig, key: str | None) -> None:
        found[role] = await ask(config, key)

    async with anyio.create_task_group() as tg:
        for role, (config, key) in roles.items():
            tg.start_soon(one, role, config, key)
    return {role: found[role] for role in roles}
