"""The SpecAgent mechanism check: strong-model work and modelled cost, spec vs strong-only.

    .venv/bin/python -m bench.engine [--cost-model FILE] [--draft-steps 8] [--seed 0]

Eight small file tasks run by the real engine (`Engine.run`) through the real proxy, in front of
the real npm filesystem server on a temp dir. The models are scripted (the scripted model
server: real HTTP, the product's `openai` client), so the trajectories are FIXED and their
errors KNOWN:

    gold      each task has a gold step sequence: tool calls, then the final answer.
    weak      drafts the gold, short tool calls with no reasoning, except on six tasks where it
              leaves the gold at a known step (a detour): it reads the wrong file, writes wrong
              content, writes from the wrong observed record, uses the wrong write tool, or
              answers before doing the work. Once the history is back on the gold, it follows it.
    strong    as verifier (thinking off) accepts the longest segment prefix that matches the
              gold (tool names and arguments) and else names the first wrong step, with the gold
              step as replacement_action, or null on two tasks so that the repair turn runs (its
              reply: the gold step as a tool call, with reasoning). As the author in strong-only
              (thinking on) it takes the gold steps itself, each reply with a reasoning text of
              150-400 words (seeded).

Each task runs in `spec` and `strong-only` (and `weak-only`, reported only for success: it shows
the planted errors are real). The files are reset before every run, and each run's final file
state and answer are checked against the gold. One unmeasured warm-up task per mode runs first
(with one rejected write and a repair turn), so every measured task finds the prefixes shared
across sessions (instructions and tool definitions of every prompt kind) in the scripted
server's prefix cache, as on a serving deployment.

Token counts are the scripted server's (a regex tokenizer, a simulated prefix cache in 16-token
blocks): compare them with each other. Modelled time and HBM traffic come from
`bench.cost_model` (printed in full; MODELLED, not measured). A run's modelled
wall time = the sum over its model calls of modelled prefill + decode time, plus its measured
non-model time: the run's wall_s minus the latencies of its model calls (tool calls through the
proxy, the audit log's fsyncs, the engine's own work).

Prints the cost model, the tasks, a per-task markdown table, totals with spec / strong-only
ratios, where the modelled seconds go, and how the ratios move with the strong decode rate.
"""
