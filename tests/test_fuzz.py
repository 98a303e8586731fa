"""Malformed JSON-RPC at both fronts: the proxy answers what it can, drops the rest, and keeps serving.

The stdio front is the real `mcp-spec-proxy` command, spawned once per test; every example writes
one line to its stdin and then pings it, so a line that gets no answer (not JSON, a notification,
an envelope the SDK cannot parse) still proves the process alive. The HTTP front runs in this
process on port 0. Hypothesis is derandomized (`derandomize=True`, no example database), so the
examples are the same on every run; it drives the async peers from a worker thread through
`anyio.from_thread`.
"""

from __future__ import annotations

import itertools
import json
import string
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import anyio.to_thread
import httpx
import pytest
import yaml
from anyio.streams.buffered import BufferedByteReceiveStream
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client

from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.http import serve_http
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from tests.harness import PROXY_COMMAND, text_of, toy

pytestmark = pytest.mark.anyio

FUZZ = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
ANSWER_TIMEOUT_S = 10
MAX_LINE = 8 * 1024 * 1024
MAX_DEPTH = 64  # well inside any JSON parser's nesting limit; deeper requests may be refused unanswered
PROBE_PREFIX = "probe-"  # our own ids; generated ids never start with it

# `subscriptions/listen` is left out: it is a long-lived stream that answers only when it ends.
METHODS = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
    "resources/subscribe",
    "completion/complete",
    "logging/setLevel",
    "server/discover",
    "notifications/initialized",
    "notifications/cancelled",
    "notifications/progress",
    "notifications/roots/list_changed",
    "sampling/createMessage",
]
INITIALIZE_PARAMS = {
    "protocolVersion": "2025-06-18",
    "capabilities": {},
    "clientInfo": {"name": "fuzz", "version": "0"},
}


def config(tmp_path: Path) -> dict[str, Any]:
    # Only tools that answer at once: no `hang`, no `crash`. Writes are denied by policy.
    return {
        "servers": {"toy": toy(tmp_path / "rec", tools={"include": ["echo", "record"]})},
        "review": {"default": "deny"},
    }


# -- what is sent ----------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=16,
)
objects = st.dictionaries(st.text(max_size=12), json_values, max_size=4)
good_ids = (
    st.integers(min_value=-(2**31), max_value=2**31)
    | st.integers(min_value=2**63, max_value=2**200)  # huge ids
    | st.integers(max_value=-(2**63))
    | st.text(max_size=40).filter(lambda s: not s.startswith(PROBE_PREFIX))
)
ids = good_ids | json_values  # and wrong types: null, booleans, floats, arrays, objects
strings = st.text(max_size=30) | json_values  # a string where one belongs, or anything else
metas = json_values | st.fixed_dictionaries({}, optional={"progressToken": json_values, "junk": json_values})

# Parameters shaped like each method's, with fields missing, mistyped or unknown.
tool_names = st.sampled_from(["toy__echo", "toy__record", "toy__nope", "toy__", ""]) | st.text(max_size=30)
argument_values = st.text(max_size=20) | json_values
arguments = st.dictionaries(st.sampled_from(["text", "value", "intent", "extra"]), argument_values, max_size=4)
# Well-typed calls reach the barrier (validation, review, forwarding); mistyped ones stop at the SDK.
well_typed_calls = st.fixed_dictionaries(
    {"name": tool_names},
    optional={
        "arguments": arguments,
        "_meta": st.fixed_dictionaries({}, optional={"progressToken": st.integers() | st.text(max_size=8)}),
    },
)
mistyped_calls = st.fixed_dictionaries(
    {"name": tool_names | json_values},
    optional={"arguments": arguments | json_values, "_meta": metas, "task": json_values, "inputResponses": json_values},
)
near_valid_calls = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["toy__echo", "toy__record"]),
        "arguments": st.fixed_dictionaries(
            {}, optional={"text": st.text(), "value": st.text(), "intent": st.text(), "extra": json_values}
        ),
    }
)
call_params = st.sampled_from([well_typed_calls, mistyped_calls]).flatmap(lambda chosen: chosen)
PARAMS = {
    "tools/call": call_params,
    "initialize": st.fixed_dictionaries(
        {},
        optional={
            "protocolVersion": st.sampled_from(["2025-06-18", "2026-07-28", "1999-01-01"]) | strings,
            "capabilities": objects | json_values,
            "clientInfo": st.fixed_dictionaries({}, optional={"name": strings, "version": strings}) | json_values,
        },
    ),
    "prompts/get": st.fixed_dictionaries({}, optional={"name": strings, "arguments": json_values}),
    "resources/read": st.fixed_dictionaries({}, optional={"uri": st.just("file:///etc/passwd") | strings}),
    "notifications/cancelled": st.fixed_dictionaries({}, optional={"requestId": ids, "reason": strings}),
    "notifications/progress": st.fixed_dictionaries(
        {}, optional={"progressToken": json_values, "progress": json_values, "total": json_values}
    ),
}
GENERIC_PARAMS = st.fixed_dictionaries({}, optional={"cursor": strings, "_meta": metas}) | objects


def shaped_request(method: str) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON-RPC 2.0 request to `method` with a well-typed id and (mis)shaped params."""
    return st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "id": good_ids, "method": st.just(method)},
        optional={"params": PARAMS.get(method, GENERIC_PARAMS)},
    )


plausible_requests = st.sampled_from(METHODS).flatmap(shaped_request)
# Calls the barrier gets to judge: its validation, the deny reviewer, forwarding to the backend.
barrier_calls = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0"), "id": good_ids, "method": st.just("tools/call"), "params": near_valid_calls}
)
requests = plausible_requests | st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0") | json_values, "method": st.sampled_from(METHODS) | strings},
    optional={"id": ids, "params": json_values, "result": json_values, "error": json_values, "extra": json_values},
)
responses = st.fixed_dictionaries(
    {"jsonrpc": st.just("2.0"), "id": ids},
    optional={"result": json_values, "error": json_values},
)


def encode(message: Any, ascii_only: bool = True) -> bytes:
    return json.dumps(message, ensure_ascii=ascii_only).encode()


def nested(depth: int) -> bytes:
    return b'{"jsonrpc":"2.0","id":7,"method":"ping","params":{"a":' + b"[" * depth + b"]" * depth + b"}}"


def big_echo(size: int) -> bytes:
    call = {"name": "toy__echo", "arguments": {"text": "x" * size}}
    return encode({"jsonrpc": "2.0", "id": size, "method": "tools/call", "params": call})


def single_line(raw: bytes) -> bytes:
    return raw.replace(b"\n", b" ").replace(b"\r", b" ")


encoded_requests = st.builds(encode, plausible_requests, st.booleans())  # UTF-8 on the wire, or \u escapes
encoded_calls = st.builds(encode, barrier_calls, st.booleans())
valid_lines = st.builds(encode, requests, st.booleans()) | st.builds(encode, responses)
survivable_lines = st.one_of(
    valid_lines,
    valid_lines.flatmap(lambda line: st.integers(0, max(0, len(line) - 1)).map(lambda cut: line[:cut])),  # cut off
    json_values.map(encode),  # JSON, but not JSON-RPC
    st.lists(requests, max_size=3).map(encode),  # batches (not in MCP)
    st.binary(max_size=200).map(single_line),  # junk bytes, invalid UTF-8 included
    st.text(max_size=200).map(lambda s: single_line(s.encode())),
    st.integers(1, 400).map(nested),  # nesting past what parsers allow
    st.integers(0, 200_000).map(big_echo),
)
# Two lines in three must be answered (a third of all lines reach the barrier); the rest probe what the
# proxy must survive. (Not `a | b | c`: hypothesis flattens that into one choice among every branch.)
lines = st.sampled_from([encoded_calls, encoded_requests, survivable_lines]).flatmap(lambda chosen: chosen)


# -- the oracle --------------------------------------------------------------------------------


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def expected_id(line: bytes) -> Any | None:
    """The id a line must be answered under: it is plainly a JSON-RPC 2.0 request (object, string
    `method`, integer or string `id`, object `params` if any, modest nesting). `None` for everything
    else, which may get an answer or may not, but must never hurt the process."""
    try:
        message = json.loads(line, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return None
    method, ident, call_params = message.get("method"), message.get("id"), message.get("params", {})
    if not isinstance(method, str) or method == "subscriptions/listen":
        return None
    if isinstance(ident, bool) or not isinstance(ident, int | str):
        return None
    if not isinstance(call_params, dict) or _depth(message) > MAX_DEPTH:
        return None
    return ident


def key(ident: Any) -> str:
    return json.dumps(ident, sort_keys=True)


def assert_answer(message: dict[str, Any], ident: Any) -> None:
    """A JSON-RPC 2.0 response to `ident`: a result, or an error object with a code and a message."""
    assert message.get("jsonrpc") == "2.0", message
    assert key(message.get("id")) == key(ident), message
    assert ("result" in message) != ("error" in message), message
    if "error" in message:
        error = message["error"]
        assert isinstance(error, dict), message
        assert isinstance(error.get("code"), int) and not isinstance(error.get("code"), bool), message
        assert isinstance(error.get("message"), str), message
    else:
        assert isinstance(message["result"], dict), message


# -- stdio ---------------------------------------------------------------------------------------


class StdioPeer:
    """Writes lines to the spawned proxy and collects its answers by id."""

    def __init__(self, process: anyio.abc.Process, stderr: Path) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._process = process
        self._stdin = process.stdin
        self._stdout = BufferedByteReceiveStream(process.stdout)
        self._stderr = stderr
        self._answers: dict[str, dict[str, Any]] = {}
        self._probes = itertools.count()

    def _diagnosis(self) -> str:
        return f"proxy exit code {self._process.returncode}; stderr:\n{self._stderr.read_text()[-3000:]}"

    async def send(self, line: bytes) -> None:
        await self._stdin.send(line + b"\n")

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        ident = f"{PROBE_PREFIX}{next(self._probes)}"
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": ident, "method": method}
        if params is not None:
            message["params"] = params
        await self.send(encode(message))
        (answer,) = await self.answers(ident)
        return answer

    async def answers(self, *idents: Any) -> list[dict[str, Any]]:
        """Read stdout until every id in `idents` has its answer; every line must be JSON-RPC."""
        wanted = [key(ident) for ident in idents]
        try:
            with anyio.fail_after(ANSWER_TIMEOUT_S):
                while not all(k in self._answers for k in wanted):
                    raw = await self._stdout.receive_until(b"\n", MAX_LINE)
                    message = json.loads(raw)
                    assert isinstance(message, dict) and message.get("jsonrpc") == "2.0", raw[:500]
                    if "method" not in message:  # requests and notifications from the proxy are not answers
                        self._answers[key(message.get("id"))] = message
        except (TimeoutError, anyio.EndOfStream, anyio.IncompleteRead) as exc:
            raise AssertionError(f"no answer to {wanted} ({exc!r}); {self._diagnosis()}") from exc
        return [self._answers.pop(k) for k in wanted]

    def answered(self, ident: Any) -> dict[str, Any] | None:
        """The answer to `ident` if it has already been read (never waits)."""
        return self._answers.get(key(ident))

    async def exchange(self, line: bytes) -> None:
        """Send one fuzzed line; wait for its answer if it must have one, and for a ping's."""
        await self.send(line)
        ident = expected_id(line)
        probe = f"{PROBE_PREFIX}{next(self._probes)}"
        await self.send(encode({"jsonrpc": "2.0", "id": probe, "method": "ping"}))
        if ident is None:
            (pong,) = await self.answers(probe)
        else:
            answer, pong = await self.answers(ident, probe)
            assert_answer(answer, ident)
        assert pong.get("result") == {}, pong
        # Answers to lines that need none (and stray late ones) must not satisfy a later example.
        self._answers.clear()
        assert self._process.returncode is None, self._diagnosis()


@asynccontextmanager
async def spawned_proxy(tmp_path: Path) -> AsyncIterator[StdioPeer]:
    config_file = tmp_path / "servers.yaml"
    config_file.write_text(yaml.safe_dump(config(tmp_path)))
    stderr = tmp_path / "proxy.stderr"
    command = [PROXY_COMMAND, "--config", str(config_file), "--state-dir", str(tmp_path / "state")]
    with stderr.open("wb") as err:
        process = await anyio.open_process([*command, "--log-level", "WARNING"], stderr=err)
    try:
        yield StdioPeer(process, stderr)
    finally:
        with anyio.CancelScope(shield=True):
            assert process.stdin is not None
            await process.stdin.aclose()
            with anyio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_stdio_front_answers_or_drops_malformed_lines_and_keeps_serving(tmp_path: Path) -> None:
    async with spawned_proxy(tmp_path) as peer:
        with anyio.fail_after(60):
            assert "result" in await peer.request("initialize", INITIALIZE_PARAMS)
        await peer.send(encode({"jsonrpc": "2.0", "method": "notifications/initialized"}))

        @FUZZ
        @given(line=lines)
        def fuzz(line: bytes) -> None:
            anyio.from_thread.run(peer.exchange, line)

        await anyio.to_thread.run_sync(fuzz)

        # The same process still serves a client from the handshake on.
        init = await peer.request("initialize", INITIALIZE_PARAMS)
        await peer.send(encode({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        listed = await peer.request("tools/list")
        echoed = await peer.request("tools/call", {"name": "toy__echo", "arguments": {"text": "still here"}})
    assert init["result"]["serverInfo"]["name"] == "mcp-spec-proxy"
    assert sorted(tool["name"] for tool in listed["result"]["tools"]) == ["toy__echo", "toy__record"]
    assert echoed["result"]["content"] == [{"type": "text", "text": "still here"}]


UNPARSEABLE_REQUESTS = {
    41: b'{"jsonrpc":"2.0","id":41,"method":"tools/call","params":["toy__echo"]}',  # params an array
    42: b'{"jsonrpc":"1.0","id":42,"method":"ping"}',  # not JSON-RPC 2.0
    43: nested(300).replace(b'"id":7', b'"id":43'),  # deeper than the SDK's parser goes
    None: b'{"jsonrpc":"2.0","id":44,"method":"ping"',  # not JSON: the id cannot be known
}


async def test_stdio_front_answers_an_unparseable_request_with_an_error(tmp_path: Path) -> None:
    async with spawned_proxy(tmp_path) as peer:
        with anyio.fail_after(60):
            await peer.request("initialize", INITIALIZE_PARAMS)
        for line in UNPARSEABLE_REQUESTS.values():
            await peer.send(line)
        await peer.request("ping")  # lines are read in order: the bad ones have been handled by now
        unanswered = [ident for ident in UNPARSEABLE_REQUESTS if peer.answered(ident) is None]
    assert unanswered == [], f"no answer at all to the requests with ids {unanswered}"


async def test_stdio_front_answers_a_request_whose_id_is_neither_a_string_nor_an_integer(tmp_path: Path) -> None:
    """The SDK takes such a message for a notification; its sender would wait for ever."""
    async with spawned_proxy(tmp_path) as peer:
        with anyio.fail_after(60):
            await peer.request("initialize", INITIALIZE_PARAMS)
            for odd in (b"1.5", b'{"n": 1}', b"null", b"[1]", b"true"):
                await peer.send(b'{"jsonrpc":"2.0","id":' + odd + b',"method":"ping"}')
                await peer.request("ping")  # lines are read in order: the odd one is handled by now
                answer = peer.answered(None)
                assert answer is not None, f"no answer to a request with the id {odd!r}"
                assert answer["error"]["code"] == -32600
                peer._answers.clear()
            await peer.send(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"x"}}')
            await peer.request("ping")
            assert peer.answered(None) is None  # a real notification still gets no answer


# -- streamable HTTP ---------------------------------------------------------------------------

HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
MODERN = "2026-07-28"
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "fuzz", "version": "0"},
}
_HEADER_SAFE = set(string.ascii_letters + string.digits + string.punctuation + " ")


@asynccontextmanager
async def http_front(tmp_path: Path) -> AsyncIterator[str]:
    parsed = ProxyConfig.model_validate(config(tmp_path))
    with anyio.fail_after(60):
        async with running_proxy(parsed, StatePaths(tmp_path / "state")) as proxy, anyio.create_task_group() as tg:
            front = McpFront(proxy)
            port = await tg.start(lambda task_status: serve_http(front, "127.0.0.1", 0, task_status=task_status))
            yield f"http://127.0.0.1:{port}/mcp"
            tg.cancel_scope.cancel()


def with_envelope(message: dict[str, Any]) -> dict[str, Any]:
    """The message as a 2026-07-28 client would stamp it, where its shape allows."""
    params = message.get("params", {})
    if isinstance(params, dict) and isinstance(params.get("_meta", {}), dict):
        message = {**message, "params": {**params, "_meta": {**params.get("_meta", {}), **ENVELOPE}}}
    return message


def modern_headers(message: Any) -> dict[str, str]:
    headers = {**HEADERS, "MCP-Protocol-Version": MODERN}
    if not isinstance(message, dict):
        return headers
    method, params = message.get("method"), message.get("params")
    if isinstance(method, str) and set(method) <= _HEADER_SAFE:
        headers["Mcp-Method"] = method
    name = params.get("name") if isinstance(params, dict) else None
    if isinstance(name, str) and set(name) <= _HEADER_SAFE:
        headers["Mcp-Name"] = name
    return headers


def sse_messages(text: str) -> Iterator[Any]:
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            yield json.loads(line[5:])


stamped_requests = st.builds(
    lambda message, ascii_only: encode(with_envelope(message), ascii_only),
    st.sampled_from([barrier_calls, plausible_requests]).flatmap(lambda chosen: chosen),
    st.booleans(),
)
# Where each body goes: into the live legacy session, as a stateless 2026-07-28 request (stamped
# like a real client's, or not), or with no session at all.
posts = st.sampled_from(
    [
        st.tuples(st.just("session"), lines),
        st.tuples(st.just("modern"), stamped_requests),
        st.tuples(st.sampled_from(["no-session", "modern"]), lines),
    ]
).flatmap(lambda chosen: chosen)


class HttpPeer:
    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http = http
        self.url = url
        self.session = ""

    async def start_session(self) -> None:
        first = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INITIALIZE_PARAMS}
        response = await self.http.post(self.url, json=first, headers=HEADERS)
        assert response.status_code == 200, response.text
        self.session = response.headers["mcp-session-id"]
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await self.http.post(self.url, json=done, headers={**HEADERS, "Mcp-Session-Id": self.session})

    async def post(self, where: str, body: bytes) -> None:
        try:
            message = json.loads(body)
        except (ValueError, RecursionError):
            message = None
        headers = {
            "no-session": HEADERS,
            "session": {**HEADERS, "Mcp-Session-Id": self.session},
            "modern": modern_headers(message),
        }[where]
        with anyio.fail_after(ANSWER_TIMEOUT_S):
            response = await self.http.post(self.url, content=body, headers=headers)
        assert response.status_code < 500, (response.status_code, response.text[:500])
        content_type = response.headers.get("content-type", "")
        if content_type.startswith("text/event-stream"):
            answers = list(sse_messages(response.text))
        elif response.content and content_type.startswith("application/json"):
            answers = [response.json()]
        else:
            answers = []
            assert not response.content or response.status_code >= 400, response.text[:500]
        for answer in answers:
            assert isinstance(answer, dict) and answer.get("jsonrpc") == "2.0", answer
            assert ("result" in answer) != ("error" in answer), answer
        if response.status_code >= 400 and content_type.startswith("application/json"):
            assert answers and "error" in answers[-1], response.text[:500]
        ident = expected_id(body)
        if ident is not None and where != "no-session":
            # A plain request gets its own answer, under its own id: in the live session always a 200;
            # on the 2026-07-28 era a refusal may come as a 4xx, still carrying the id.
            assert where == "modern" or response.status_code == 200, (response.status_code, response.text[:500])
            (answer,) = [a for a in answers if "method" not in a]
            assert_answer(answer, ident)


async def test_http_front_never_answers_5xx_and_keeps_serving(tmp_path: Path) -> None:
    async with http_front(tmp_path) as url, httpx.AsyncClient(timeout=ANSWER_TIMEOUT_S) as http:
        peer = HttpPeer(http, url)
        await peer.start_session()

        @FUZZ
        @given(post=posts)
        def fuzz(post: tuple[str, bytes]) -> None:
            anyio.from_thread.run(peer.post, *post)

        await anyio.to_thread.run_sync(fuzz)

        still = await http.post(
            url,
            json={"jsonrpc": "2.0", "id": "after", "method": "tools/list"},
            headers={**HEADERS, "Mcp-Session-Id": peer.session},
        )
        async with Client(url) as client:
            names = sorted(tool.name for tool in (await client.list_tools()).tools)
            echoed = await client.call_tool("toy__echo", {"text": "still here"})
    assert still.status_code == 200 and '"toy__echo"' in still.text
    assert names == ["toy__echo", "toy__record"]
    assert text_of(echoed) == "still here"


async def test_stdio_front_survives_an_integer_past_pythons_digit_limit(tmp_path: Path) -> None:
    huge = b"1" * 5000
    lines = [
        b'{"jsonrpc":"2.0","id":51,"method":"ping","params":{"_meta":{"n":' + huge + b"}}}",
        b'{"jsonrpc":"2.0","id":' + huge + b',"method":"ping"}',
        b'{"jsonrpc":"2.0","id":52,"method":"tools/call","params":{"name":"toy__echo","arguments":{"text":'
        + huge
        + b"}}}",
        b'{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":' + huge + b"}}",
    ]
    async with spawned_proxy(tmp_path) as peer:
        with anyio.fail_after(60):
            await peer.request("initialize", INITIALIZE_PARAMS)
        for line in lines:
            await peer.send(line)
        pong = await peer.request("ping")  # the process is alive and still serving, in order
        answered = [peer.answered(51), peer.answered(52)]
    assert pong.get("result") == {}
    assert all(answer is not None for answer in answered), answered
