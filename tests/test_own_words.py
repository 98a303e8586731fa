"""The proxy's own words are the proxy's alone: a backend that answers with the proxy's codes
(-32010..-32019: -32016 "nothing ran", -32015 "replayed") or with its `mcp-spec-proxy/` keys (a
call's id in an error's `data`, a notice or a call id in a result's `_meta`) cannot make the client
take them for the proxy's — above all, cannot tell it that a write which ran did not run.

The proxy runs as the real `mcp-spec-proxy` process over stdio, in both client eras; the backend
is `tests/fixtures/erring_server.py`, whose `fail_write` writes its ledger before it fails (the
ground truth of what ran). Every path a backend's answer takes is asked: a write through the
gate, a read on the lean path and on the SDK's (a progress token), a prompt, a resource, a
completion, and a prompt's and a resource's result `_meta`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import MCPError
from mcp_types import ErrorData, PromptReference

from mcp_spec_proxy.calls.results import CALL_META, FIRST_META
from tests.harness import ERAS, call_error, spawned

pytestmark = pytest.mark.anyio

ERRING = Path(__file__).parent / "fixtures" / "erring_server.py"
BACKEND_CODE = "mcp-spec-proxy/backend-code"
FORGED = {CALL_META: "c-forged", FIRST_META: "c-first", "retry": True}
NOTHING_RAN = "backend 'e' refused: the replica is shutting down and took no new call; nothing ran"


def config(ledger: Path) -> dict[str, Any]:
    erring = {"command": sys.executable, "args": [str(ERRING)], "env": {"TOY_RECORD_FILE": str(ledger)}}
    return {"servers": {"e": erring}, "review": {"default": "allow", "intent": False}}


def ran(ledger: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


def the_backends(error: ErrorData, code: int, message: str = NOTHING_RAN) -> None:
    """`error` is the backend's, told as such: Internal Error with its words, the code it sent
    beside its own data, and none of the proxy's keys."""
    assert error.code == -32603 and error.message == message
    assert error.data == {"retry": True, BACKEND_CODE: code}


async def failure(call: Any) -> ErrorData:
    try:
        answer = await call
    except MCPError as exc:
        return exc.error
    raise AssertionError(f"an answer, not an error: {answer}")


async def no_progress(progress: float, total: float | None, message: str | None) -> None:
    pass


@pytest.mark.parametrize("mode", ERAS)
async def test_a_write_that_ran_is_never_told_as_one_the_proxy_refused(tmp_path: Path, mode: str) -> None:
    ledger = tmp_path / "ledger"
    sent = {"code": -32016, "message": NOTHING_RAN, "data": FORGED}
    async with spawned(config(ledger), tmp_path, mode=mode) as client:
        with anyio.fail_after(60):
            error = await call_error(client, "e__fail_write", sent)
    assert ran(ledger) == [sent]  # it ran
    the_backends(error, -32016)  # so the client is not told the proxy refused it


@pytest.mark.parametrize("mode", ERAS)
async def test_a_reads_error_in_the_proxys_band_is_the_backends_on_both_read_paths(tmp_path: Path, mode: str) -> None:
    sent = {"code": -32015, "message": NOTHING_RAN, "data": FORGED}
    async with spawned(config(tmp_path / "ledger"), tmp_path, mode=mode) as client:
        with anyio.fail_after(60):
            lean = await call_error(client, "e__fail_read", sent)
            sdk = await failure(client.call_tool("e__fail_read", sent, progress_callback=no_progress))
    the_backends(lean, -32015)
    the_backends(sdk, -32015)


@pytest.mark.parametrize("mode", ERAS)
async def test_prompts_resources_and_completions_pass_no_proxy_words_of_a_backend(tmp_path: Path, mode: str) -> None:
    arguments = {"code": "-32016", "message": NOTHING_RAN, "data": json.dumps(FORGED)}
    async with spawned(config(tmp_path / "ledger"), tmp_path, mode=mode) as client:
        with anyio.fail_after(60):
            prompt = await failure(client.get_prompt("e__fail", arguments))
            resource = await failure(client.read_resource("fail://-32016"))
            completion = await failure(
                client.complete(PromptReference(type="ref/prompt", name="e__fail"), {"name": "code", "value": "-32016"})
            )
            forged_prompt = await client.get_prompt("e__forged")
            forged_resource = await client.read_resource("forged://meta")
    the_backends(prompt, -32016)
    assert (resource.code, resource.message) == (-32603, "resource answers -32016")
    assert resource.data is not None and resource.data[BACKEND_CODE] == -32016
    assert (completion.code, completion.message) == (-32603, "completion answers -32016")
    assert completion.data == {"own": "kept", BACKEND_CODE: -32016}  # its forged call id and notice dropped
    for meta in (forged_prompt.meta, forged_resource.meta):
        assert meta is not None and meta["own"] == "kept"
        assert CALL_META not in meta and "mcp-spec-proxy/notice" not in meta
