"""The MCP conformance suite's client, played by mcp-spec-proxy: `client_driver.py SERVER_URL`.

The suite runs this as its `--command` (`conformance client --command "python tests/conformance/client_driver.py"`)
with the scenario's server URL last and its scenario and context in `MCP_CONFORMANCE_SCENARIO` and
`MCP_CONFORMANCE_CONTEXT`. The proxy is the client under test: this script writes a config with
that URL as the one backend (`auth: oauth`; the context's pre-registered client, or its client
credentials with the issuer the server's protected resource metadata names), starts a real
`mcp-spec-proxy` on stdio, and, as its client, waits for the backend's tools and calls the first.

The login is headless and goes the way a person's does: the proxy opens the authorization URL with
Python's `webbrowser`, and `BROWSER` names this same script with `--browser URL`, which fetches the
URL, takes the authorization server's redirect and follows it to the proxy's loopback listener.

With `CLIENT_DRIVER_LOGIN` set, it first logs in with `mcp-spec-proxy login` (and runs `check`),
then serves with `BROWSER=false`: the proxy must use the kept tokens. `CLIENT_DRIVER_KEEP` names a
folder to leave the config, the state, the logs and those commands' output in.

Exit status 0 when a tool was called through the proxy; 1 when the backend never came up (some
scenarios want exactly that: the suite judges by what its server saw, not by this status).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

# Imports past the standard library are made where they are used: `--browser` runs once per login
# and loads nothing it does not need.

ROOT = Path(__file__).resolve().parents[2]
PROXY = str(Path(sys.executable).parent / "mcp-spec-proxy")
CIMD_URL = "https://conformance-test.local/client-metadata.json"  # the document the suite's servers serve
TOOLS_WAIT_S = float(os.environ.get("CLIENT_DRIVER_WAIT_S", "20"))  # for the backend's tools to appear
PUBLISH_WAIT_S = 3.0
SERVER = "remote"
SECRET_ENV = "CONFORMANCE_CLIENT_SECRET"
KEY_ENV = "CONFORMANCE_CLIENT_KEY"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _issuer(url: str) -> str:
    """The authorization server the resource's protected resource metadata names (RFC 9728)."""
    import httpx2
    from mcp.client.auth.utils import build_protected_resource_metadata_discovery_urls

    for candidate in build_protected_resource_metadata_discovery_urls(None, url):
        response = httpx2.get(candidate, timeout=10)
        if response.status_code == 200:
            issuer: str = response.json()["authorization_servers"][0]
            return issuer
    raise SystemExit(f"no protected resource metadata for {url}")


def config(url: str, scenario: str, context: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The proxy's config for one scenario, and the environment its secret is read from."""
    auth: dict[str, Any] = {"callback_port": _free_port(), "login_timeout": 30}
    env: dict[str, str] = {}
    if context.get("client_secret"):
        env[SECRET_ENV] = str(context["client_secret"])
    if scenario.startswith("auth/client-credentials"):
        auth.update(grant="client_credentials", client_id=context["client_id"], issuer=_issuer(url))
        if context.get("private_key_pem"):  # private_key_jwt: the key signs the client's assertion
            env[KEY_ENV] = str(context["private_key_pem"])
            auth.update(private_key_env=KEY_ENV, signing_algorithm=context.get("signing_algorithm", "RS256"))
        else:
            auth["client_secret_env"] = SECRET_ENV
    elif context.get("client_id"):
        auth["client_id"] = context["client_id"]
        if env:
            auth["client_secret_env"] = SECRET_ENV
    else:
        auth["client_metadata_url"] = CIMD_URL
    modern = os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION", "2026-07-28") >= "2026-07-28"
    server = {"url": url, "auth": auth, "protocol": "auto" if modern else "legacy", "startup_timeout": 20}
    return {"servers": {SERVER: server}, "review": {"default": "allow"}}, env


async def drive(url: str) -> int:
    import anyio
    import mcp_types as types
    import yaml
    from mcp.client.client import Client
    from mcp.client.session import IncomingMessage
    from mcp.client.stdio import StdioServerParameters, stdio_client

    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    keep = os.environ.get("CLIENT_DRIVER_KEEP")  # a folder to leave the config, state and logs in
    with tempfile.TemporaryDirectory(prefix="client-driver-") as folder:
        work = Path(keep or folder)
        work.mkdir(parents=True, exist_ok=True)
        settings, secrets = config(url, scenario, context)
        settings["telemetry"] = str(work / "telemetry.jsonl")  # decisions and spans: no token may reach them
        (work / "servers.yaml").write_text(yaml.safe_dump(settings))
        browser = f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} --browser %s"
        env = {**os.environ, **secrets, "BROWSER": browser, "PYTHONPATH": str(ROOT)}
        files = ["--config", str(work / "servers.yaml"), "--state-dir", str(work / "state")]
        if os.environ.get("CLIENT_DRIVER_LOGIN"):
            # Log in from the command line first, then serve with no browser at all: the proxy must
            # use the kept tokens, never ask again.
            for argv in ([PROXY, "login", SERVER, *files], [PROXY, "check", *files]):
                with anyio.fail_after(120):
                    done = await anyio.run_process(argv, env=env, check=False)
                said = (done.stdout + done.stderr).decode(errors="replace")
                (work / f"{argv[1]}.out").write_text(f"{done.returncode}\n{said}")
            env["BROWSER"] = "false"
        params = StdioServerParameters(command=PROXY, args=[*files, "--no-console"], env=env)
        changed = anyio.Event()

        async def on_message(message: IncomingMessage) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                changed.set()

        log = work / "proxy.log"
        with log.open("w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), mode="legacy", message_handler=on_message) as client:
                outcome = await _settled(log)
                if outcome != "connected":
                    print(f"client_driver: the backend {outcome}; the proxy said:\n{log.read_text()}", file=sys.stderr)
                    return 1
                tools = (await client.list_tools()).tools
                with anyio.move_on_after(PUBLISH_WAIT_S):  # connected is said just before its tools are published
                    while not tools:
                        await changed.wait()
                        changed = anyio.Event()
                        tools = (await client.list_tools()).tools
                if tools:  # some scenarios' servers have none: connecting was the point
                    result = await client.call_tool(tools[0].name, {})
                    print(f"client_driver: called {tools[0].name}: error={result.is_error}", file=sys.stderr)
    return 0


async def _settled(log: Path) -> str:
    """Whether the proxy's backend connected or failed to log in, as its log says."""
    import anyio

    with anyio.move_on_after(TOOLS_WAIT_S):
        while True:
            text = log.read_text(errors="replace")
            if f"backend '{SERVER}' connected" in text:
                return "connected"
            if f"backend '{SERVER}' could not log in" in text:
                return "could not log in"
            await anyio.sleep(0.1)
    return f"did not connect within {TOOLS_WAIT_S:g}s"


def browse(url: str) -> int:
    """What a person's browser does: open the authorization URL, follow its redirect to the loopback."""

    class NoRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    try:
        urllib.request.build_opener(NoRedirects).open(url, timeout=10)
    except urllib.error.HTTPError as redirected:
        location = redirected.headers.get("location")
        if redirected.code in (301, 302, 303, 307, 308) and location:
            with urllib.request.urlopen(location, timeout=10):  # the proxy's loopback listener
                return 0
    print("browser: no redirect from the authorization server", file=sys.stderr)
    return 1


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--browser":
        return browse(sys.argv[2])
    if len(sys.argv) != 2:
        print(f"usage: {sys.argv[0]} SERVER_URL", file=sys.stderr)
        return 2
    import anyio

    return anyio.run(drive, sys.argv[1])


if __name__ == "__main__":
    sys.exit(main())
