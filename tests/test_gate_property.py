"""The write promise as a property: at every door, the calls a backend ran are the calls the policy allows.

Each case draws a configuration (a default reviewer, a reviewer per backend tool, `on_reject`),
a user (approves, declines, or cannot be asked), what the strong verifier answers (accept, or
reject with or without a replacement naming either backend) and what the repair turn proposes.
The weak and strong models both try to write once. The ground truth is what the two toy
backends recorded; the oracle below is the policy written out plainly, separately from the
gate's code: `deny` never runs, `human` runs only with the user's yes, a call the strong model
wrote needs no second model verdict, a substitute meets its own tool's reviewer. The audit must
tell each write's story under one id: held → verdict → forwarded or blocked.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.engine.result import Mode
from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests.harness import approve, proxied, recorded, segment_length, toy, verdict

pytestmark = pytest.mark.anyio

REVIEWS = ["deny", "human", "strong", "allow", "strong_then_human"]
DOORS = ["front", "delegate:spec", "delegate:weak-only", "delegate:strong-only", "run:spec", "run:weak-only", "gateway"]
SEEDS = range(5)
RUN_MODES: dict[str, Mode] = {"spec": "spec", "weak-only": "weak-only", "strong-only": "strong-only"}


@dataclass(frozen=True)
class Case:
    default: str
    review: dict[str, str | None]  # per server: its `record` tool's reviewer override
    on_reject: str
    user: str  # approve | decline | absent
    verifier: str  # accept | reject
    replacement: str | None  # the server a rejecting verdict proposes, or none
    repair: str  # the server the repair turn proposes
    target: str  # the server whose `record` the agent calls

    @classmethod
    def draw(cls, seed: int, door: str) -> Case:
        rng = random.Random(f"{door}/{seed}")
        return cls(
            default=rng.choice(REVIEWS),
            review={s: rng.choice([None, *REVIEWS]) for s in "ab"},
            on_reject=rng.choice(["block", "replace", "repair"]),
            user=rng.choice(["approve", "decline", "absent"]),
            verifier=rng.choice(["accept", "reject"]),
            replacement=rng.choice([None, "a", "b"]),
            repair=rng.choice(["a", "b"]),
            target=rng.choice(["a", "b"]),
        )

    def mode(self, server: str) -> str:
        return self.review[server] or self.default

    # -- the oracle: which writes the policy lets through, per door -------------------------------

    def strong_authored_runs(self, server: str) -> bool:
        mode = self.mode(server)
        return mode != "deny" and (mode != "human" or self.user == "approve")

    def substitute(self, replacement_first: bool = True) -> dict[str, list[str]]:
        server = self.replacement if (replacement_first and self.replacement) else self.repair
        return {server: ["sub"]} if self.strong_authored_runs(server) else {}

    def expected(self, door: str) -> dict[str, list[str]]:
        kind, _, mode = door.partition(":")
        mode = mode or "spec"
        user = self.user if kind in ("front", "delegate") else "absent"
        case = Case(**{**self.__dict__, "user": user})
        return case._expected(kind, mode)

    def _expected(self, kind: str, mode: str) -> dict[str, list[str]]:
        x, review, yes = self.target, self.mode(self.target), self.user == "approve"
        accept = self.verifier == "accept"
        orig = {x: ["orig"]}
        if kind == "front":
            if review == "deny" or (review == "human" and not yes):
                return {}
            if review in ("allow",) or (review == "human" and yes):
                return orig
            if accept or (review == "strong_then_human" and yes):
                return orig
            if review == "strong_then_human" or self.on_reject == "block":
                return {}
            if self.on_reject == "replace":
                return self.substitute() if self.replacement else {}
            return self.substitute()
        if mode == "spec":
            if review == "deny":
                return self.substitute(replacement_first=False)  # deny proposes nothing: repair
            if not accept:
                return self.substitute()
            if review == "human" and not yes:
                return self.substitute(replacement_first=False)
            return orig
        if mode == "strong-only" or kind == "run":  # strong-authored, or an operator's baseline
            return orig if self.strong_authored_runs(x) else {}
        # weak-only at delegate: every weak write meets its tool's reviewer, nothing in its place
        runs = {
            "deny": False,
            "human": yes,
            "allow": True,
            "strong": accept,
            "strong_then_human": accept or yes,
        }[review]
        return orig if runs else {}


def models(case: Case) -> Respond:
    def answer(request: ChatRequest) -> Reply | str:
        if request.json_schema is not None:
            if case.verifier == "accept":
                return verdict(segment_length(request))
            proposal = {"tool": f"{case.replacement}__record", "arguments": {"value": "sub"}}
            return verdict(segment_length(request) - 1, "wrong", proposal if case.replacement else None)
        if any("Rejected step:" in str(m.get("content")) for m in request.messages):  # the repair turn
            return Reply(tool_calls=[ToolCall(f"{case.repair}__record", {"value": "sub"})])
        if request.tools and not any(m.get("role") == "tool" for m in request.messages):
            return Reply(tool_calls=[ToolCall(f"{case.target}__record", {"value": "orig"})])
        return "done"

    return Respond(answer)


def config(case: Case, server: ScriptedModelServer, tmp_path: Path) -> dict[str, Any]:
    endpoint = {"base_url": server.base_url, "max_retries": 0}
    servers = {}
    for name in "ab":
        override = {"record": {"review": case.review[name]}} if case.review[name] else {}
        servers[name] = toy(tmp_path / f"{name}-ledger", tools={"overrides": override})
    return {
        "servers": servers,
        "models": {"weak": {**endpoint, "model": "weak-model"}, "strong": {**endpoint, "model": "strong-model"}},
        "review": {"default": case.default, "on_reject": case.on_reject, "fallback": "deny", "intent": False},
        "speculation": {"max_steps": 6},
    }


async def drive(door: str, case: Case, cfg: dict[str, Any], tmp_path: Path) -> None:
    kind, _, mode = door.partition(":")
    elicitation = {"approve": approve(True), "decline": approve(False), "absent": None}[case.user]
    async with proxied(cfg, tmp_path / "state", twins=True, elicitation=elicitation) as p:
        if kind == "front":
            await p.client.call_tool(f"{case.target}__record", {"value": "orig"})
        elif kind == "delegate":
            await p.client.call_tool("delegate", {"task": "record it", "mode": mode})
        elif kind == "run":
            assert p.proxy.engine is not None
            await p.proxy.engine.run("record it", RUN_MODES[mode], baseline=True)  # what `mcp-spec-proxy run` does
        else:
            async with anyio.create_task_group() as tg:
                gateway = Gateway(p.proxy)
                port = await tg.start(
                    lambda task_status: serve_gateway(gateway, "127.0.0.1", 0, task_status=task_status)
                )
                async with httpx.AsyncClient(timeout=60) as http:
                    body = {"model": "spec", "messages": [{"role": "user", "content": "record it"}]}
                    await http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
                tg.cancel_scope.cancel()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("door", DOORS)
async def test_backends_run_exactly_what_the_policy_allows(tmp_path: Path, door: str, seed: int) -> None:
    case = Case.draw(seed, door)
    async with ScriptedModelServer(models(case)) as server:
        await drive(door, case, config(case, server, tmp_path), tmp_path)
    ran = {s: [json.loads(line)["value"] for line in recorded(tmp_path / f"{s}-ledger")] for s in "ab"}
    expected = case.expected(door)
    assert {s: v for s, v in ran.items() if v} == expected, case

    events = read_audit(tmp_path / "state" / "audit.jsonl") if (tmp_path / "state" / "audit.jsonl").exists() else []
    stories: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        if event["event"] != "read" and "call" in event:
            stories.setdefault(event["call"], []).append(event)
    forwarded: dict[str, int] = {}
    for story in stories.values():
        kinds = [e["event"] for e in story]
        assert kinds in (["held", "verdict", "forwarded"], ["held", "verdict", "blocked"]), (kinds, case)
        if kinds[-1] == "forwarded":
            assert story[1]["accepted"] is True
            forwarded[story[0]["server"]] = forwarded.get(story[0]["server"], 0) + 1
    assert forwarded == {s: len(v) for s, v in expected.items()}, case
