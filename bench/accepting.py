"""The scripted strong model of the throughput benchmarks: it accepts every segment at once.

`Respond(accept_everything)` behind a `ScriptedModelServer` serving `MODEL`: the verdict's
accepted_steps is the number of steps in the review prompt's segment block, so every held write
goes through, and what is measured is the proxy's own path to a verdict.
"""

from __future__ import annotations

import json

from mcp_spec_proxy.testing import ChatRequest, Reply

MODEL = "scripted-strong"


def accept_everything(request: ChatRequest) -> Reply:
    """An accepting verdict: accepted_steps is the number of steps in the segment block."""
    for message in reversed(request.messages):
        text = str(message.get("content"))
        if "# Segment to verify" in text:
            steps = len(json.loads(text.split("```json\n", 1)[1].split("\n```", 1)[0]))
            verdict = {"reason": "matches the intent", "accepted_steps": steps, "replacement_action": None}
            return Reply(content=json.dumps(verdict))
    raise ValueError("not a verification request: no '# Segment to verify' message")
