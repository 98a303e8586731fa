"""How a real small model acts: native `tools` against JSON-schema actions, side by side in one run.

    .venv/bin/python -m bench.actions [--rounds 2]

Starts the local model (SmolLM2-135M-Instruct behind llama.cpp, `scripts/local_model.py`, one
CPU thread) and sends the same drafting requests through the product's own model client
(`ChatModel.complete`) twice, interleaved: once with `actions: tools` (native `tools`, the
model's template renders them, llama.cpp parses its tool calls) and once with `actions: json`
(a `response_format` JSON schema, the union of the tools' calls and the final answer, enforced
by llama.cpp's grammar). Each answer is classed as a valid tool call (a known tool whose
arguments validate against its schema), an invalid one, a plain-text answer, or a model error.

What this measures is protocol, not quality: whether the request the proxy sends gets back
something the engine can run. Requests that ask for an action should get one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import jsonschema

from bench.measure import local_model, machine_line
from mcp_spec_proxy.config.providers import Actions
from mcp_spec_proxy.models import ChatModel, ModelConfig, ModelError

REPO = Path(__file__).resolve().parent.parent
PATH = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a text file.", "parameters": PATH}},
    {"type": "function", "function": {"name": "list_dir", "description": "List a folder.", "parameters": PATH}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The current time in a timezone.",
            "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write text to a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
REQUESTS = [
    "Read the file notes.txt and tell me what it says.",
    "What files are in the folder /home/me/projects?",
    "What time is it in Tokyo right now?",
    "Write 'buy milk' into todo.txt.",
    "Show me the contents of /etc/hosts.",
    "List everything in the docs folder.",
    "What's the time in UTC?",
    "Save the text 'meeting at noon' to calendar.txt.",
]
SYSTEM = "You are an agent. Use the tools to do what the user asks; call one tool now."


def classify(completion: Any) -> str:
    if completion.tool_calls:
        call = completion.tool_calls[0]
        if call.name not in SCHEMAS:
            return "invalid call"
        try:
            jsonschema.validate(json.loads(call.arguments or "{}"), SCHEMAS[call.name])
        except (ValueError, jsonschema.ValidationError):
            return "invalid call"
        return "valid call"
    if completion.action_error:
        return "invalid call"
    return "text answer"


async def measure(url: str, rounds: int) -> dict[str, list[tuple[str, float, int]]]:
    base = ModelConfig(
        base_url=url,
        model="smollm2-135m",
        provider="llamacpp",
        max_retries=0,
        timeout=120,
        temperature=0,
        max_tokens=160,
        extra_body={"dry_multiplier": 0.8, "repeat_penalty": 1.2},
    )
    modes: tuple[Actions, ...] = ("tools", "json")
    models = {mode: ChatModel("weak", base.model_copy(update={"actions": mode})) for mode in modes}
    seen: dict[str, list[tuple[str, float, int]]] = {mode: [] for mode in models}
    try:
        for round_ in range(rounds):
            for n, request in enumerate(REQUESTS):
                order: tuple[Actions, ...] = ("tools", "json") if (n + round_) % 2 == 0 else ("json", "tools")
                for mode in order:
                    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": request}]
                    started = time.perf_counter()
                    try:
                        completion = await models[mode].complete(messages, purpose="draft", thinking=False, tools=TOOLS)
                        kind, tokens = classify(completion), completion.call.completion_tokens
                    except ModelError:
                        kind, tokens = "model error", 0
                    seen[mode].append((kind, time.perf_counter() - started, tokens))
    finally:
        for model in models.values():
            await model.aclose()
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with local_model() as url:
        seen = anyio.run(measure, url, args.rounds)
    print(machine_line())
    print(f"{len(REQUESTS)} requests x {args.rounds} rounds per mode, interleaved; SmolLM2-135M, llama.cpp, 1 thread\n")
    print("| actions | valid call | invalid call | text answer | model error | p50 s | mean decode tokens |")
    print("|---|---|---|---|---|---|---|")
    for mode, rows in seen.items():
        kinds = Counter(kind for kind, _, _ in rows)
        total = len(rows)
        share = {k: f"{kinds[k]}/{total}" for k in ("valid call", "invalid call", "text answer", "model error")}
        p50 = statistics.median(seconds for _, seconds, _ in rows)
        decode = statistics.mean(tokens for _, _, tokens in rows)
        print(
            f"| {mode} | {share['valid call']} | {share['invalid call']} | {share['text answer']} |"
            f" {share['model error']} | {p50:.2f} | {decode:.0f} |"
        )


if __name__ == "__main__":
    main()
