"""The gateway under `auth:`: the same bearer JWTs as the MCP front, minted by a real authorization
server (oauth2-mock-server, `tests/oauth.py`). Without a valid token nothing runs (401 naming the
protected resource metadata, which the gateway serves); with one, the principal sees what
`access:` shows it, its run's calls meet `rules:` as its own, and the audit names it. The
backends are the toy's ledgers: what a ledger lacks did not run."""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from mcp_spec_proxy.calls.audit import read_audit
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.gateway import Gateway, serve_gateway
from mcp_spec_proxy.fronts.gateway_sessions import GatewaySession, Sessions, prefix_digests
from mcp_spec_proxy.principal import Principal
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall
from tests.harness import PROXY_COMMAND, proxy_env, recorded, toy, toy_twins
from tests.oauth import INTROSPECTION_CLIENT, AuthServer, authorization_server

pytestmark = pytest.mark.anyio

AUDIENCE = "http://127.0.0.1/mcp"  # the proxy's canonical URL: the gateway takes the MCP front's tokens
ACCESS = [{"when": 'server == "bank" && !("finance" in principal.groups)', "hide": True}]
RULES = [
    {"name": "admins", "when": '"admins" in principal.groups', "review": "allow"},
    {"name": "others", "when": "true", "deny": "only admins change the ledgers"},
]


@dataclass
class Gw:
    url: str
    auth: AuthServer
    http: httpx.AsyncClient
    offered: dict[str, set[str]]

    async def token(self, sub: str, *groups: str, audience: str = AUDIENCE) -> str:
        return await self.auth.mint(sub=sub, client_id=f"cli-{sub}", aud=audience, scope="mcp", groups=list(groups))

    async def chat(self, text: str, token: str | None, **headers: str) -> httpx.Response:
        body = {"model": "strong-only", "messages": [{"role": "user", "content": text}]}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return await self.http.post(f"{self.url}/v1/chat/completions", json=body, headers=headers)


def answer(offered: dict[str, set[str]], request: ChatRequest) -> Reply | str:
    """The agent: `<who> asks: call <tool>` calls that tool once, then answers."""
    if any(message["role"] == "tool" for message in request.messages):
        return "Done."
    task = str(request.messages[-1]["content"])
    who, tool = task.split()[0], task.split()[-1]
    offered[who] = {t["function"]["name"] for t in request.tools}
    return Reply(tool_calls=[ToolCall(tool, {"value": f"{who} via the gateway"})])


@asynccontextmanager
async def gateway(tmp_path: Path, *, introspection: bool = False) -> AsyncIterator[Gw]:
    offered: dict[str, set[str]] = {}
    async with (
        authorization_server() as auth,
        ScriptedModelServer(Respond(functools.partial(answer, offered))) as model,
    ):
        strong = {"base_url": model.base_url, "max_retries": 0, "model": "strong-model"}
        raw: dict[str, Any] = {
            "servers": {"toy": toy(tmp_path / "toy"), "bank": toy(tmp_path / "bank")},
            "review": {"default": "human", "intent": False},
            "auth": {"issuer": auth.issuer, "audience": AUDIENCE, "scopes": ["mcp"]},
            "access": ACCESS,
            "rules": RULES,
            "models": {"strong": strong},
        }
        environ: dict[str, str] = {}
        if introspection:
            client_id, secret = INTROSPECTION_CLIENT
            raw["auth"]["introspection"] = {"client_id": client_id, "client_secret_env": "INTROSPECTION_SECRET"}
            environ["INTROSPECTION_SECRET"] = secret
        config, state = ProxyConfig.model_validate(raw), StatePaths(tmp_path / "state")
        with anyio.fail_after(60):
            async with (
                running_proxy(config, state, in_process=toy_twins(raw), environ=environ) as proxy,
                anyio.create_task_group() as tg,
            ):
                port = await tg.start(functools.partial(serve_gateway, Gateway(proxy), "127.0.0.1", 0))
                async with httpx.AsyncClient(timeout=30) as http:
                    yield Gw(f"http://127.0.0.1:{port}", auth, http, offered)
                tg.cancel_scope.cancel()


async def test_without_a_valid_token_the_gateway_answers_401_naming_its_resource_metadata(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        bare = await gw.chat("ann asks: call toy__record", None)
        elsewhere = await gw.chat(
            "ann asks: call toy__record", await gw.token("ann", audience="https://other.example/")
        )
        models = await gw.http.get(f"{gw.url}/v1/models")
        path_form = await gw.http.get(f"{gw.url}/.well-known/oauth-protected-resource/mcp")
        root_form = await gw.http.get(f"{gw.url}/.well-known/oauth-protected-resource")
        issuer = gw.auth.issuer
    for refused in (bare, elsewhere, models):
        assert refused.status_code == 401
        challenge = refused.headers["www-authenticate"]
        assert challenge.startswith("Bearer ") and 'error="invalid_token"' in challenge
        assert 'resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource/mcp"' in challenge
    for document in (path_form, root_form):
        assert document.status_code == 200
        metadata = document.json()
        assert metadata["resource"] == AUDIENCE and [s.rstrip("/") for s in metadata["authorization_servers"]] == [
            issuer.rstrip("/")
        ]
    assert recorded(tmp_path / "toy") == [] and recorded(tmp_path / "bank") == []


async def test_each_principal_sees_its_tools_meets_its_rules_and_is_named_in_the_audit(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        ann, bob = await gw.token("ann", "finance", "admins"), await gw.token("bob", "eng")
        ann_pays = await gw.chat("ann asks: call bank__record", ann)
        bob_writes = await gw.chat("bob asks: call toy__record", bob)
        offered = dict(gw.offered)
    assert ann_pays.status_code == 200 and bob_writes.status_code == 200, (ann_pays.text, bob_writes.text)
    assert "bank__record" in offered["ann"] and not any(name.startswith("bank__") for name in offered["bob"])
    assert recorded(tmp_path / "bank") == ['{"value": "ann via the gateway"}'] and recorded(tmp_path / "toy") == []
    lines = read_audit(tmp_path / "state" / "audit.jsonl")
    verdicts = [
        (v["principal"]["sub"], v["tool"], v.get("rule"), v["accepted"]) for v in lines if v["event"] == "verdict"
    ]
    assert verdicts == [("ann", "bank__record", "admins", True), ("bob", "toy__record", "others", False)]
    held = [line for line in lines if line["event"] in ("held", "forwarded", "blocked")]
    assert {json.dumps(line["principal"], sort_keys=True) for line in held} == {
        json.dumps({"client_id": "cli-ann", "sub": "ann"}, sort_keys=True),
        json.dumps({"client_id": "cli-bob", "sub": "bob"}, sort_keys=True),
    }


async def test_an_opaque_token_the_issuer_vouches_for_drives_the_gateway_as_its_principal(tmp_path: Path) -> None:
    async with gateway(tmp_path, introspection=True) as gw:
        fields: dict[str, Any] = {"client_id": "cli-ann", "aud": AUDIENCE, "scope": "mcp"}
        ann = await gw.auth.opaque(sub="ann", groups=["finance", "admins"], **fields)
        inactive = await gw.auth.opaque(sub="ann", groups=["finance", "admins"], active=False, **fields)
        ann_pays = await gw.chat("ann asks: call bank__record", ann)
        refused = await gw.chat("ann asks: call bank__record", inactive)
    assert ann_pays.status_code == 200, ann_pays.text
    assert refused.status_code == 401 and 'error="invalid_token"' in refused.headers["www-authenticate"]
    assert recorded(tmp_path / "bank") == ['{"value": "ann via the gateway"}']  # its groups met `access:` and `rules:`
    lines = read_audit(tmp_path / "state" / "audit.jsonl")
    verdicts = [(v["principal"]["sub"], v["tool"], v.get("rule")) for v in lines if v["event"] == "verdict"]
    assert verdicts == [("ann", "bank__record", "admins")]


async def test_a_gateway_session_is_continued_only_by_the_principal_that_opened_it() -> None:
    sessions = Sessions(8, 60.0, lambda: 0.0)
    ann = Principal("https://id.example.com/", "ann", "cli")
    bob = Principal("https://id.example.com/", "bob", "cli")
    first = [{"role": "user", "content": "hello"}]
    opened = GatewaySession("s1", 0.0, ann)
    sessions.took_in(opened, first, prefix_digests(first)[-1])
    opened.answer = "hi"
    later = [*first, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "and then?"}]
    digests = prefix_digests(later)
    assert sessions.find("s1", later, digests, ann.key) is opened
    assert sessions.find("s1", later, digests, bob.key) is None  # a name is each principal's own
    bobs = GatewaySession("s1", 0.0, bob)
    assert sessions.took_in(bobs, later, digests[-1]) == []  # bob's "s1" does not start ann's over
    assert sessions.find("s1", later, digests, ann.key) is opened


def test_the_gateway_command_refuses_a_shared_token_beside_auth(tmp_path: Path) -> None:
    config = tmp_path / "servers.yaml"
    raw = {
        "servers": {},
        "auth": {"issuer": "https://id.example.com/", "audience": AUDIENCE},
        "models": {"strong": {"base_url": "http://127.0.0.1:9/v1", "model": "strong-model"}},
    }
    config.write_text(yaml.safe_dump(raw))
    argv = [PROXY_COMMAND, "gateway", "-c", str(config), "--state-dir", str(tmp_path / "s"), "--port", "0"]
    shared = {**proxy_env(), "SHARED": "s3cret"}
    ran = subprocess.run([*argv, "--token-env", "SHARED"], env=shared, capture_output=True, timeout=120)
    assert ran.returncode != 0
    said = ran.stderr.decode()
    assert "drop --token-env" in said and "Traceback" not in said, said
