"""Concurrent client sessions over streamable HTTP against one mcp-spec-proxy process.

    .venv/bin/python -m bench.load [--levels 1,8,32,128] [--calls 20]

One real `mcp-spec-proxy --http 127.0.0.1:PORT --telemetry FILE` process serves every level, with
the npm filesystem and memory servers behind it and `review: {default: strong}`: each write's
verdict comes from the scripted OpenAI-compatible model server, which runs in this process and
accepts every segment at once. At each level N, N sessions connect (an `mcp.Client(url)` each;
even-numbered sessions `mode="legacy"`, odd ones `mode="2026-07-28"`), wait at a common start,
then each makes its calls one after another:

    every 5th call a reviewed write, alternately fs__write_file (the session's own file, unique
    content) and memory__create_entities (a unique entity), each with an `intent`;
    the other calls reads, cycling fs__read_text_file (a shared 2 KB file),
    memory__search_nodes (the session's own entities), fs__read_text_file, memory__read_graph.

`--levels 1,8,32,128:10` gives a level its own number of calls per session (here 10 at 128).

Per level: throughput (calls / wall time from the common start to the last answer), p50/p99
latency per call for reads and writes separately, errors (exceptions, timeouts, isError results),
and the peak RSS (VmHWM) of the proxy process and of its children (the backends), each reset
(`/proc/PID/clear_refs`) before the level, so the figure is that level's own peak. Also printed:
latency per client era, the CPU seconds the proxy, its backends and this process used during
the calls, each review's model round trip (from the telemetry) and the machine's load average.

Afterwards it checks the barrier's promises against `<state-dir>/audit.jsonl`, the telemetry,
the scripted model server's request count and the files on disk, prints PASS/FAIL for each,
and exits 1 on any FAIL. Every wait is bounded: a call, a session, a level, the proxy's start
and stop.
"""
