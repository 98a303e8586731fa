"""The conformance suite's client authorization scenarios, with mcp-spec-proxy as the client.

Each `auth/*` scenario the 2026-07-28 requirements score (and the client-credentials extension) runs
as one `conformance client --scenario NAME --command "python tests/conformance/client_driver.py"`:
the suite starts its resource and authorization servers, the driver starts a real proxy with that
URL as an `auth: oauth` backend, the proxy logs in headlessly (its `webbrowser` opens the URL with
the driver's `--browser`, which follows the redirect to the proxy's loopback) and a tool is called
through the proxy's front. A scenario passes when its checks.json holds at least one SUCCESS and no
FAILURE or WARNING. The scenarios run PARALLEL_RUNS at a time, in one module-scoped run every test
reads. A strict xfail would name a failure outside the proxy; there is none.

The attack scenarios are among them: a protected resource naming another resource
(`auth/resource-mismatch`), a wrong or missing `iss` in the authorization response
(`auth/iss-wrong-issuer`, `auth/iss-unexpected`, `auth/iss-supported-missing`), metadata naming
another issuer (`auth/metadata-issuer-mismatch`), a backend asking for a scope never granted
(`auth/scope-step-up`: a new login, not the old token; `auth/scope-retry-limit`: not for ever).
`test_no_token_reaches_the_proxys_logs_or_state` reads what a login left behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.backends import REPO, conformance_cli
from tests.conformance_runner import ANSI, Outcome

SUITE = "0.2.0-alpha.12"  # the release with the 2026-07-28 requirements
DRIVER = REPO / "tests" / "conformance" / "client_driver.py"
PARALLEL_RUNS = 3
SCENARIO_TIMEOUT = 150.0  # seconds for one scenario's `conformance client` on a busy 2-core machine
AUTH_SCENARIOS = [
    "auth/metadata-default",
    "auth/metadata-var1",
    "auth/metadata-var2",
    "auth/metadata-var3",
    "auth/basic-cimd",
    "auth/scope-from-www-authenticate",
    "auth/scope-from-scopes-supported",
    "auth/scope-omitted-when-undefined",
    "auth/scope-step-up",
    "auth/scope-retry-limit",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none",
    "auth/pre-registration",
    "auth/resource-mismatch",
    "auth/offline-access-scope",
    "auth/offline-access-not-supported",
    "auth/authorization-server-migration",
    "auth/iss-supported",
    "auth/iss-not-advertised",
    "auth/iss-supported-missing",
    "auth/iss-wrong-issuer",
    "auth/iss-unexpected",
    "auth/iss-normalized",
    "auth/metadata-issuer-mismatch",
]
EXTENSIONS = ["auth/client-credentials-basic", "auth/client-credentials-jwt"]
XFAILS: dict[str, str] = {}
TOKEN_SHAPED = re.compile(r"[A-Za-z0-9._~+/=-]{16,}")


@dataclass(frozen=True)
class Ran:
    scenario: str
    outcome: Outcome
    output: str

    def report(self) -> str:
        problems = "; ".join(self.outcome.problems) or "no successful check (not reached?)"
        return f"{self.scenario}: {problems}\n{self.output[-4000:]}"


def run_scenario(scenario: str, results: Path, keep: Path | None = None, *, login: bool = False) -> Ran:
    """One client scenario with the driver as its client; `keep` keeps the driver's folder there;
    `login`: the driver logs in with `mcp-spec-proxy login` before it serves."""
    results.mkdir(parents=True)
    command = f"{sys.executable} {DRIVER}"
    argv = [*conformance_cli(SUITE).argv, "client", "--command", command, "--scenario", scenario, "-o", str(results)]
    argv += ["--timeout", str(int(SCENARIO_TIMEOUT * 1000) - 10_000)]
    env = {**os.environ, **({"CLIENT_DRIVER_KEEP": str(keep)} if keep else {})}
    if login:
        env["CLIENT_DRIVER_LOGIN"] = "1"
    try:
        run = subprocess.run(argv, capture_output=True, text=True, timeout=SCENARIO_TIMEOUT, cwd=REPO, env=env)
        output = ANSI.sub("", run.stdout + run.stderr)
    except subprocess.TimeoutExpired:
        output = f"timed out after {SCENARIO_TIMEOUT:.0f}s"
    checks = next(results.glob("**/checks.json"), None)
    found = tuple(json.loads(checks.read_text())) if checks is not None else ()
    return Ran(scenario, Outcome(found), output)


def list_auth_scenarios() -> list[str]:
    """The auth/* client scenarios the 2026-07-28 requirements name."""
    argv = [*conformance_cli(SUITE).argv, "list", "--client", "--requirements", "2026-07-28"]
    listed = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True).stdout
    scored = listed.split("Client scenarios", 1)[1].split("\n\n", 1)[0]  # not the extensions, never scored
    return re.findall(r"^\s+- (auth/\S+)", scored, re.MULTILINE)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Ran]]:
    root = tmp_path_factory.mktemp("client-conformance")
    with ThreadPoolExecutor(max_workers=PARALLEL_RUNS) as pool:
        futures = {
            name: pool.submit(run_scenario, name, root / name.replace("/", "_")) for name in AUTH_SCENARIOS + EXTENSIONS
        }
        yield {name: future.result() for name, future in futures.items()}


PARAMS = [
    pytest.param(name, marks=[pytest.mark.xfail(reason=XFAILS[name], strict=True)] if name in XFAILS else [], id=name)
    for name in AUTH_SCENARIOS + EXTENSIONS
]


@pytest.mark.parametrize("scenario", PARAMS)
def test_auth_scenario_passes_with_the_proxy_as_the_client(runs: dict[str, Ran], scenario: str) -> None:
    ran = runs[scenario]
    assert ran.outcome.passed, ran.report()


def test_the_scenario_list_names_every_auth_scenario_of_the_requirements() -> None:
    assert sorted(list_auth_scenarios()) == sorted(AUTH_SCENARIOS)


def test_no_token_reaches_the_proxys_logs_or_state(tmp_path: Path) -> None:
    """After a login, a refresh-capable token is in the token file and nowhere else the proxy writes."""
    kept = tmp_path / "driver"
    ran = run_scenario("auth/offline-access-scope", tmp_path / "results", keep=kept)
    assert ran.outcome.passed, ran.report()
    [token_file] = kept.glob("state/oauth/*.json")
    tokens = json.loads(token_file.read_text())["tokens"]
    secrets = [tokens["access_token"], *([tokens["refresh_token"]] if tokens.get("refresh_token") else [])]
    assert all(TOKEN_SHAPED.fullmatch(secret) for secret in secrets)  # long enough that a hit is no accident
    written = [p for p in kept.rglob("*") if p.is_file() and p != token_file]
    assert any(p.name == "proxy.log" for p in written)  # the proxy's own log (at INFO), and its state
    for path in written:
        text = path.read_text(errors="replace")
        for secret in secrets:
            assert secret not in text, f"a token in {path.relative_to(kept)}"


def test_a_login_from_the_command_line_is_what_the_serving_proxy_uses(tmp_path: Path) -> None:
    """`login SERVER` logs in through the browser and keeps the tokens; `check` says so (never the
    token); the proxy then serves with no browser at all (`BROWSER=false`) and reaches the backend
    on the kept token: the authorization server saw one login."""
    kept = tmp_path / "driver"
    ran = run_scenario("auth/metadata-default", tmp_path / "results", keep=kept, login=True)
    assert ran.outcome.passed, ran.report()
    login = (kept / "login.out").read_text()
    check = (kept / "check.out").read_text()
    assert login.startswith("0\n") and "remote: logged in" in login, login
    assert check.startswith("0\n") and "remote: logged in, token expires in" in check, check
    authorizations = [c for c in ran.outcome.checks if c["id"] == "authorization-request"]
    assert len(authorizations) == 1
    token = json.loads(next(kept.glob("state/oauth/*.json")).read_text())["tokens"]["access_token"]
    assert token not in login + check
    called = [c for c in ran.outcome.checks if "tools/call" in json.dumps(c)]
    assert called, "the serving proxy made no call on the kept token"
