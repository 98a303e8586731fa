"""The MCP conformance suite behind the proxy passes as it passes directly (DESIGN.md, "Transparent").

For each pinned suite version (tests/conformance_runner.py: `latest` and the newest release), every
server scenario runs with `--suite all` five ways, each one `conformance` process:

* direct: against tests/fixtures/conformance_server.py, the project's own implementation of the
  suite's "everything server" contract, on streamable HTTP;
* proxy: through a real `mcp-spec-proxy --http 127.0.0.1:0` process wrapping the same fixture on
  stdio (backends `test` and `json`, separator `_`, so the scenarios find the names they call),
  with servers.yaml's defaults (the handshake era, `protocol: legacy`) and `review.default: allow`;
* shipped: the same, with the `review:` section of the shipped servers.yaml;
* url and auto: the proxy in front of the direct run's fixture as a URL backend under its own names, as
  the suite's reference server is wrapped, in `protocol: legacy` and in `protocol: auto`.

A scenario passes when its checks.json holds at least one SUCCESS and no FAILURE or WARNING.
What fails directly is a strict xfail in DIRECT_FAILS, naming what the fixture (or the SDK under
it) lacks; every other scenario must pass behind the proxy, save the strict xfails in GAPS, each
naming what the proxy does not relay or serve yet. Under the shipped settings a scenario passing
behind the proxy must still pass, save SHIPPED: where the gate acts. A strict xfail that starts
passing fails the run, so its entry goes.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass

import pytest

from tests.conformance_runner import (
    PARITY_REVIEW,
    SUITES,
    Served,
    SuiteRun,
    fixture_server,
    list_scenarios,
    mcp_spec_proxy,
    proxy_config,
    run_suite,
    shipped_review,
)

PARALLEL_RUNS = 3  # `conformance` processes at once: each is mostly Node starting (~1 s of CPU)

_SHARED = [
    "server-initialize",
    "logging-set-level",
    "ping",
    "completion-complete",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-with-logging",
    "tools-call-error",
    "tools-call-with-progress",
    "tools-call-sampling",
    "tools-call-elicitation",
    "json-schema-2020-12",
    "elicitation-sep1034-defaults",
    "server-sse-polling",
    "server-sse-multiple-streams",
    "elicitation-sep1330-enums",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "resources-subscribe",
    "resources-unsubscribe",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
    "dns-rebinding-protection",
]
_INPUT_REQUIRED_SCENARIOS = [  # those the fixture fails directly; the suite has one more
    "basic-elicitation",
    "basic-sampling",
    "basic-list-roots",
    "request-state",
    "multiple-input-requests",
    "multi-round",
    "missing-input-response",
    "non-tool-request",
    "result-type",
    "tampered-state",
    "capability-check",
    "ignore-extra-params",
]
_NEW_IN_0_2 = [
    "server-session-lifecycle",
    "server-stateless",
    "sep-2164-resource-not-found",
    "sep-2640-skills-directory",
    "sep-2640-skills-enumeration",
    "sep-2640-skills-manifest",
    "caching",
    "http-header-validation",
    "http-custom-header-server-validation",
    "tasks-lifecycle",
    "tasks-capability-negotiation",
    "tasks-wire-fields",
    "tasks-request-state-removal",
    "tasks-mrtr-input",
    "tasks-request-headers",
    "tasks-dispatch-and-envelope",
    "tasks-status-notifications",
    "tasks-required-task-error",
    "tasks-mrtr-composition",
    "input-required-result-unsupported-methods",
    "input-required-result-validate-input",  # passes as an unknown tool's -32602, directly and behind
    *(f"input-required-result-{name}" for name in _INPUT_REQUIRED_SCENARIOS),
]
SCENARIOS = {"0.1.16": _SHARED, "0.2.0-alpha.12": [*_SHARED, *_NEW_IN_0_2]}

_TASKS = "the fixture implements no tasks extension (SEP-2663): no tool creates a task"
_INPUT_REQUIRED = (
    "the fixture asks the client on the handshake era's back-channel (sampling/createMessage,"
    " elicitation/create), never with an input_required result (SEP-2322)"
)
DIRECT_FAILS = {
    "0.1.16": {
        "server-sse-polling": "WARNINGs: the SDK primes an SSE stream (event id, retry) only for 2025-11-25"
        " or later, and this scenario's POST says 2025-03-26",
    },
    "0.2.0-alpha.12": {
        "http-custom-header-server-validation": "the fixture has no tool with x-mcp-header annotations",
        "server-stateless": "WARNINGs: the SDK's server/discover result carries no serverInfo _meta, and the"
        " fixture has no test_trigger_prompt_change or test_trigger_tool_change hook",
        **{f"input-required-result-{name}": _INPUT_REQUIRED for name in _INPUT_REQUIRED_SCENARIOS},
        **{name: _TASKS for name in _NEW_IN_0_2 if name.startswith("tasks-")},
    },
}

GAPS: dict[str, dict[str, str]] = {
    "0.1.16": {},
    "0.2.0-alpha.12": {},
}

SHIPPED: dict[str, dict[str, str]] = {"0.1.16": {}, "0.2.0-alpha.12": {}}


def _params(version: str, names: list[str], xfails: dict[str, str]) -> Iterator[object]:
    for name in names:
        marks = [pytest.mark.xfail(reason=xfails[name], strict=True)] if name in xfails else []
        yield pytest.param(version, name, marks=marks, id=f"{version}-{name}")


DIRECT = [p for v in SUITES for p in _params(v, SCENARIOS[v], DIRECT_FAILS[v])]
BEHIND = [p for v in SUITES for p in _params(v, [s for s in SCENARIOS[v] if s not in DIRECT_FAILS[v]], GAPS[v])]
UNDER_SHIPPED = [
    p
    for v in SUITES
    for p in _params(v, [s for s in SCENARIOS[v] if s not in DIRECT_FAILS[v] and s not in GAPS[v]], SHIPPED[v])
]
# Which run each test reads: only the runs a selection needs are made.
_RUN_OF = {
    "test_scenario_passes_directly_against_the_fixture": "direct",
    "test_scenario_passing_directly_passes_behind_the_proxy": "proxy",
    "test_shipped_review_settings_change_only_where_the_gate_acts": "shipped",
    "test_scenario_passing_directly_passes_behind_the_proxy_over_http": "url",
    "test_scenario_passing_directly_passes_behind_the_proxy_in_protocol_auto": "auto",
}


@dataclass(frozen=True)
class Made:
    """A suite run and what it ran against (its log for the failure message)."""

    run: SuiteRun
    against: Served

    def report(self, scenario: str) -> str:
        problems = "; ".join(self.run.outcome(scenario).problems) or "no successful check (not reached?)"
        return f"{scenario}: {problems}\n{self.run.output[-3000:]}\nits server's log:\n{self.against.log_tail()}"


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Made]]:
    """Each (version, run) the selected tests read, keyed `<version>/<run>`; PARALLEL_RUNS at a time."""
    needed = sorted(
        {
            f"{item.callspec.params['version']}/{_RUN_OF[item.originalname]}"
            for item in request.session.items
            if isinstance(item, pytest.Function) and item.module is request.module and item.originalname in _RUN_OF
        }
    )
    root = tmp_path_factory.mktemp("conformance")
    with ExitStack() as stack:
        served: dict[str, Served] = {}  # one process per run kind serves both versions' runs
        kinds = {key.split("/")[1] for key in needed}
        for run in sorted(kinds | ({"direct"} if kinds & {"url", "auto"} else set()), key=lambda run: run != "direct"):
            if run == "direct":
                served[run] = stack.enter_context(fixture_server())
            elif run in ("url", "auto"):  # as the suite's reference server is wrapped: a URL backend, its own names
                protocol = "auto" if run == "auto" else "legacy"
                backend = {"url": served["direct"].url, "namespace": False, "protocol": protocol}
                url_config = {"servers": {"fixture": backend}, "review": PARITY_REVIEW}
                served[run] = stack.enter_context(mcp_spec_proxy(url_config, root / run))
            else:
                config = proxy_config(PARITY_REVIEW if run == "proxy" else shipped_review())
                served[run] = stack.enter_context(mcp_spec_proxy(config, root / run))
        with ThreadPoolExecutor(max_workers=PARALLEL_RUNS) as pool:
            made = {
                key: pool.submit(run_suite, version, served[run].url, root / version / run)
                for key in needed
                for version, run in [key.split("/")]
            }
            yield {key: Made(future.result(), served[key.split("/")[1]]) for key, future in made.items()}


@pytest.mark.parametrize(("version", "scenario"), DIRECT)
def test_scenario_passes_directly_against_the_fixture(runs: dict[str, Made], version: str, scenario: str) -> None:
    made = runs[f"{version}/direct"]
    assert made.run.outcome(scenario).passed, made.report(scenario)


@pytest.mark.parametrize(("version", "scenario"), BEHIND)
def test_scenario_passing_directly_passes_behind_the_proxy(runs: dict[str, Made], version: str, scenario: str) -> None:
    made = runs[f"{version}/proxy"]
    assert made.run.outcome(scenario).passed, made.report(scenario)


@pytest.mark.parametrize(("version", "scenario"), BEHIND)
def test_scenario_passing_directly_passes_behind_the_proxy_over_http(
    runs: dict[str, Made], version: str, scenario: str
) -> None:
    """The fixture as a URL backend (its sessions per client session, in each client's era)."""
    made = runs[f"{version}/url"]
    assert made.run.outcome(scenario).passed, made.report(scenario)


@pytest.mark.parametrize(("version", "scenario"), BEHIND)
def test_scenario_passing_directly_passes_behind_the_proxy_in_protocol_auto(
    runs: dict[str, Made], version: str, scenario: str
) -> None:
    """The same URL backend under `protocol: auto`: its first session speaks 2026-07-28, on which the
    fixture (as the reference server) offers no resource subscriptions; a handshake-era client's go
    on its handshake-era session."""
    made = runs[f"{version}/auto"]
    assert made.run.outcome(scenario).passed, made.report(scenario)


@pytest.mark.parametrize(("version", "scenario"), UNDER_SHIPPED)
def test_shipped_review_settings_change_only_where_the_gate_acts(
    runs: dict[str, Made], version: str, scenario: str
) -> None:
    made = runs[f"{version}/shipped"]
    assert made.run.outcome(scenario).passed, made.report(scenario)


@pytest.mark.parametrize("version", list(SUITES))
def test_scenario_lists_name_every_server_scenario_of_the_suite(version: str) -> None:
    assert sorted(list_scenarios(version)) == sorted(SCENARIOS[version])
