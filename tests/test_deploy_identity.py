"""The compose stack's identity provider, tested where no container runtime runs.

compose.yaml is checked as far as a file can be without one: its services, what each depends on,
whose network each link shares, what it mounts and publishes; deploy/servers.yaml loads with the
proxy's own loader and its `auth:` names the stand-in issuer. The issuer itself, deploy/idp.mjs, runs
here as the `idp` service runs it (Node and oauth2-mock-server): a client takes a token from its
token endpoint exactly as DEPLOY.md says, and the proxy's HTTP front under `auth:` takes it — the
principal and groups the token names see and meet what `access:` and `rules:` say of them.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from mcp_spec_proxy.config.schema import ProxyConfig, load_config
from mcp_spec_proxy.fronts.asgi import host_names
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.fronts.probes import Door
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from tests import backends
from tests.harness import call_error, recorded, toy, toy_twins
from tests.test_access_identity import client

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((REPO / "compose.yaml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]


def test_compose_services_depend_on_and_share_only_services_that_exist() -> None:
    for name, service in SERVICES.items():
        needs = service.get("depends_on", [])
        assert set(needs) <= set(SERVICES), (name, needs)
        network = service.get("network_mode", "")
        if network.startswith("service:"):
            assert network.removeprefix("service:") in SERVICES, (name, network)
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), (name, source)
            else:
                assert source in COMPOSE["volumes"], (name, source)


def test_the_idp_is_the_same_issuer_for_the_host_and_each_replica() -> None:
    idp = SERVICES["idp"]
    assert idp["ports"] == ["127.0.0.1:8090:8090"] and idp["environment"]["IDP_ISSUER"] == "http://localhost:8090"
    for replica in ("proxy-a", "proxy-b"):
        [link] = [s for s in SERVICES.values() if s.get("network_mode") == f"service:{replica}" and "idp" in str(s)]
        assert link["command"] == ["TCP-LISTEN:8090,fork,reuseaddr", "TCP:idp:8090"]
        assert "PROXY_ISSUER" in SERVICES[replica]["environment"]


def test_the_stacks_servers_yaml_loads_with_auth_naming_the_stand_in_issuer() -> None:
    config = load_config(REPO / "deploy" / "servers.yaml", {})
    assert config.auth is not None
    assert (config.auth.issuer, config.auth.audience) == ("http://localhost:8090", "http://localhost:8080/mcp")
    mine = load_config(REPO / "deploy" / "servers.yaml", {"PROXY_ISSUER": "https://id.example.com/"})
    assert mine.auth is not None and mine.auth.issuer == "https://id.example.com/"


@asynccontextmanager
async def deployed_idp(tmp_path: Path) -> AsyncIterator[str]:
    """deploy/idp.mjs beside an installed oauth2-mock-server, as the `idp` service runs it; its issuer."""
    home = tmp_path / "idp"
    home.mkdir()
    (home / "idp.mjs").write_text((REPO / "deploy" / "idp.mjs").read_text())
    installed = backends.BACKENDS / "oauth" / "node_modules"
    if not (installed / "oauth2-mock-server").exists():
        pytest.fail("oauth2-mock-server is not installed: run scripts/install-test-backends.sh")
    (home / "node_modules").symlink_to(installed)
    command = [backends.node22(), str(home / "idp.mjs")]
    process = await anyio.open_process(command, cwd=home, env={"IDP_PORT": "0"}, stdout=subprocess.PIPE)
    async with process:
        assert process.stdout is not None
        with anyio.fail_after(30):
            line = b""
            async for chunk in process.stdout:
                line += chunk
                if b"\n" in line:
                    break
        try:
            yield str(json.loads(line.split(b"\n")[0])["issuer"])
        finally:
            with anyio.CancelScope(shield=True):
                process.terminate()
                with anyio.move_on_after(5):
                    await process.wait()
                if process.returncode is None:
                    process.kill()


async def test_a_token_from_the_stacks_idp_as_docs_say_is_taken_by_the_front_under_auth(tmp_path: Path) -> None:
    async with deployed_idp(tmp_path) as issuer, anyio.create_task_group() as tg:
        with anyio.fail_after(60):
            door = Door(token=None, hosts=host_names("127.0.0.1"))
            port = await tg.start(door.serve, "127.0.0.1", 0)
            url = f"http://127.0.0.1:{port}/mcp"
            stack = load_config(REPO / "deploy" / "servers.yaml", {"PROXY_ISSUER": issuer, "PROXY_AUDIENCE": url})
            assert stack.auth is not None
            raw: dict[str, Any] = {
                "servers": {"toy": toy(tmp_path / "toy"), "bank": toy(tmp_path / "bank")},
                "review": {"default": "deny", "intent": False},
                "auth": stack.auth.model_dump(),
                "access": [{"when": 'server == "bank" && !("finance" in principal.groups)', "hide": True}],
                "rules": [{"when": '"finance" in principal.groups', "review": "allow"}],
            }
            config, state = ProxyConfig.model_validate(raw), StatePaths(tmp_path / "state")
            async with running_proxy(config, state, in_process=toy_twins(raw)) as proxy:
                await tg.start(functools.partial(serve_http, McpFront(proxy), "127.0.0.1", port, door=door))
                async with httpx.AsyncClient() as http:
                    tokens = {}
                    for who, groups in (("ann", "finance"), ("bob", "eng")):
                        form = {"grant_type": "client_credentials", "client_id": who, "scope": "mcp"}
                        got = await http.post(f"{issuer}/token", data={**form, "resource": url, "groups": groups})
                        tokens[who] = got.json()["access_token"]
                    bare = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
                async with client(url, tokens["ann"], "legacy") as as_ann:
                    paid = await as_ann.call_tool("bank__record", {"value": "ann pays"})
                async with client(url, tokens["bob"], "legacy") as as_bob:
                    hidden = await call_error(as_bob, "bank__record", {"value": "bob pays"})
                tg.cancel_scope.cancel()
    assert bare.status_code == 401 and "resource_metadata=" in bare.headers["www-authenticate"]
    assert not paid.is_error and "unknown tool" in hidden.message
    assert recorded(tmp_path / "bank") == ['{"value": "ann pays"}']
