"""LEASH bank lookups: exact vs approximate FAISS search at 10k, 100k and 1M vectors.

    .venv/bin/python -m bench.leash                 # the default run (< 10 minutes on 2 cores)
    .venv/bin/python -m bench.leash --sizes 10000,100000 --dims 1024 --data steps

For each (size, dim) a fresh child process (so memory figures are its own) fills a `Bank` and
measures, side by side on the same vectors and queries:

* **exact** — the bank's `IndexIDMap2(IndexFlatIP)`;
* **hnsw ef=N** — the bank past `approximate_after` (`IndexHNSWFlat`, M=32), one row per efSearch;
* **ivf-flat nprobe=N** — a plain `IndexIVFFlat` (not used by the bank), for comparison.

Lookups are single queries through `Bank.search` (k=10; the bank pins OpenMP to one thread), so
the latency includes the bank's own work (normalising, the lock, building `Neighbour`s); "faiss
p50" is the bare `index.search` on the same queries. Recall@10 is measured on held-out queries
against exact ground truth. Insert throughput is `Bank.add` in chunks of 50k (for HNSW: the whole
graph build, using every core). RSS delta is the process's resident memory after minus before
filling the bank; index bytes is the serialised index size.

Data is STRUCTURED, not uniform random. `clustered` (default): vectors of low intrinsic dimension,
as embeddings are — a 64-dim latent Gaussian mixture (2000 centres, spread 0.35) mapped linearly
into `dim` dims, plus isotropic noise (0.15), normalised; queries are fresh draws from the same
mixture. `steps`: `HashingEncoder` vectors of synthetic steps (40 tools, Zipf-distributed argument
values and observation words), queries are fresh synthetic steps (slower: ~4k steps/s to encode).

Approximate indexes are built up to `--approx-max` vectors (default 100k): an HNSW build of 1M
vectors takes many minutes on 2 cores. A configuration whose estimated peak memory exceeds 80 %
of MemAvailable is skipped and says so. Prints a markdown table, then one `LEASH_BENCH {json}` line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from bench.measure import machine_line, percentile
from mcp_spec_proxy.leash.bank import EF_CONSTRUCTION, HNSW_M, Bank
from mcp_spec_proxy.leash.encoders import EncoderInfo, HashingEncoder, StepView

REPO = Path(__file__).resolve().parent.parent
CHUNK = 50_000
LATENT = 64
CENTRES = 2000
SPREAD = 0.35
NOISE = 0.15
K = 10


# -- data --------------------------------------------------------------------------------------


class Clustered:
    def __init__(self, dim: int) -> None:
        rng = np.random.default_rng(0)
        self.dim = dim
        self.mix = (rng.standard_normal((LATENT, dim), dtype=np.float32) / np.sqrt(LATENT)).astype(np.float32)
        self.centres = rng.standard_normal((CENTRES, LATENT), dtype=np.float32)

    def draw(self, count: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        latent = self.centres[rng.integers(0, CENTRES, count)]
        latent += SPREAD * rng.standard_normal((count, LATENT), dtype=np.float32)
        points: np.ndarray = latent @ self.mix
        points += NOISE * rng.standard_normal((count, self.dim), dtype=np.float32)
        points /= np.linalg.norm(points, axis=1, keepdims=True)
        return points


class Steps:
    def __init__(self, dim: int) -> None:
        rng = np.random.default_rng(0)
        self.encoder = HashingEncoder(dim=dim)
        self.vocab = [f"w{i}" for i in range(5000)]
        weights = 1.0 / np.arange(1, 5001)
        self.zipf = weights / weights.sum()
        self.tools = [(f"srv{t % 6}__tool{t}", [f"arg{(t + j) % 9}" for j in range(1 + t % 3)]) for t in range(40)]
        self.templates = [rng.choice(5000, 30, p=self.zipf) for _ in self.tools]

    def draw(self, count: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        views = []
        for _ in range(count):
            t = int(rng.integers(40))
            name, keys = self.tools[t]
            args: dict[str, Any] = {}
            for key in keys:
                if key.endswith(("0", "3")):
                    args[key] = f"/data/{int(rng.zipf(1.3)) % 2000}/{self.vocab[int(rng.integers(5000))]}"
                else:
                    args[key] = int(rng.integers(100))
            words = list(self.templates[t][: int(rng.integers(10, 30))])
            words += list(rng.choice(5000, int(rng.integers(5, 40)), p=self.zipf))
            views.append(StepView(name, args, " ".join(self.vocab[w] for w in words)))
        return self.encoder.encode_steps_sync(views)


def chunks(source: Clustered | Steps, size: int) -> Iterator[np.ndarray]:
    for index, start in enumerate(range(0, size, CHUNK)):
        yield source.draw(min(CHUNK, size - start), seed=1000 + index)


# -- measuring ---------------------------------------------------------------------------------


def proc_status(key: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def mem_available() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def index_bytes(index: Any) -> int:
    total = 0

    def count(data: bytes) -> int:
        nonlocal total
        total += len(data)
        return len(data)

    # The writer streams the index through `count` instead of copying it (an index of a million
    # rows is gigabytes); faiss's own stub leaves its SWIG callback writer out, hence the lookup.
    writer: faiss.IOWriter = vars(faiss)["PyCallbackIOWriter"](count)
    faiss.write_index(index, writer)
    return total


def percentiles(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 50) * 1e3, percentile(samples, 99) * 1e3


def time_bank(bank: Bank, queries: np.ndarray, warmup: int = 20) -> tuple[list[float], np.ndarray]:
    for query in queries[:warmup]:
        bank.search(query, K)
    samples, found = [], np.full((len(queries), K), -1, dtype=np.int64)
    for row, query in enumerate(queries):
        started = time.perf_counter()
        neighbours = bank.search(query, K)
        samples.append(time.perf_counter() - started)
        found[row, : len(neighbours)] = [n.id for n in neighbours]
    return samples, found


@dataclass(frozen=True)
class Target:
    """One way to answer a query: `prepare` sets it up (efSearch, nprobe, threads), `search` gives ids."""

    name: str
    prepare: Callable[[], None]
    search: Callable[[np.ndarray], list[int]]


def rotate(targets: list[Target], queries: np.ndarray, block: int = 50, warmup: int = 20) -> dict[str, Any]:
    """Time every target on every query, in blocks of `block` queries whose target order rotates,
    so that machine noise (other processes on a shared VM) hits all targets alike."""
    for target in targets:
        target.prepare()
        for query in queries[:warmup]:
            target.search(query)
    results: dict[str, tuple[list[float], np.ndarray]] = {
        t.name: ([], np.full((len(queries), K), -1, dtype=np.int64)) for t in targets
    }
    for number, start in enumerate(range(0, len(queries), block)):
        shift = number % len(targets)
        for target in targets[shift:] + targets[:shift]:
            target.prepare()
            samples, found = results[target.name]
            for position in range(start, min(start + block, len(queries))):
                began = time.perf_counter()
                ids = target.search(queries[position])
                samples.append(time.perf_counter() - began)
                found[position, : len(ids)] = ids
    return results


def time_faiss(index: Any, queries: np.ndarray) -> list[float]:
    samples = []
    faiss.omp_set_num_threads(1)
    try:
        for query in queries:
            row = query[None, :]
            started = time.perf_counter()
            index.search(row, K)
            samples.append(time.perf_counter() - started)
    finally:
        faiss.omp_set_num_threads(os.cpu_count() or 1)
    return samples


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / K for f, t in zip(found.tolist(), truth.tolist(), strict=True)]))


def row(size: int, dim: int, index: str, **values: Any) -> dict[str, Any]:
    return {"size": size, "dim": dim, "index": index, **values}


def run_one(size: int, dim: int, options: argparse.Namespace) -> list[dict[str, Any]]:
    approximate = size <= options.approx_max
    raw = size * dim * 4
    # Exact: the flat storage doubles its buffer as it grows (old + new alive while copying);
    # approximate runs also keep the data for ground truth and hold the flat and HNSW copies at once.
    need = 2 * raw + (2 * raw if approximate else 0) + 6 * CHUNK * dim * 4
    if need > 0.8 * mem_available():
        reason = f"skipped: needs ~{need / 2**30:.1f} GiB, {mem_available() / 2**30:.1f} GiB available"
        return [row(size, dim, "exact", skipped=reason)]
    source: Clustered | Steps = Clustered(dim) if options.data == "clustered" else Steps(dim)
    queries = source.draw(options.queries, seed=7)
    info = EncoderInfo("hashing", "bench", dim)
    rows: list[dict[str, Any]] = []

    data = np.empty((size, dim), dtype=np.float32) if approximate else None
    generated = list(chunks(source, size)) if approximate else None
    if data is not None and generated is not None:
        np.concatenate(generated, out=data)
        del generated
    log(f"{size} x {dim}: data ready")

    # exact
    bank = Bank.in_memory(kind="step", encoder=info, approximate_after=10**12)
    before = proc_status("VmRSS")
    spent = 0.0
    for chunk in [data[i : i + CHUNK] for i in range(0, size, CHUNK)] if data is not None else chunks(source, size):
        started = time.perf_counter()
        bank.add(chunk, "success", source="import")
        spent += time.perf_counter() - started
    rss = proc_status("VmRSS") - before
    # An exact query reads every vector once: about raw / 10 GB/s on one core.
    exact_queries = queries[: max(10, min(len(queries), int(options.exact_budget_s / max(raw / 10e9, 1e-6))))]
    samples, _ = time_bank(bank, exact_queries, warmup=min(5, len(exact_queries)))
    p50, p99 = percentiles(samples)
    # `_index`: the bench times and sizes the bank's own FAISS index, which is not public API.
    faiss_p50 = percentiles(time_faiss(bank._index, exact_queries[: max(5, len(exact_queries) // 4)]))[0]
    rows.append(
        row(
            size,
            dim,
            "exact",
            insert_per_s=size / spent,
            rss_mb=rss / 2**20,
            index_mb=index_bytes(bank._index) / 2**20,
            p50_ms=p50,
            p99_ms=p99,
            faiss_p50_ms=faiss_p50,
            recall=1.0,
            queries=len(exact_queries),
        )
    )
    log(f"{size} x {dim}: exact p50 {p50:.3f} ms p99 {p99:.3f} ms over {len(exact_queries)} queries")
    del bank
    if data is None:
        return rows

    _, truth = faiss.knn(queries, data, K, metric=faiss.METRIC_INNER_PRODUCT)
    targets: list[Target] = []
    meta: dict[str, dict[str, Any]] = {}

    # hnsw, through the bank (approximate from the first vector on)
    bank = Bank.in_memory(kind="step", encoder=info, approximate_after=0, ef_search=options.ef[0])
    before = proc_status("VmRSS")
    started = time.perf_counter()
    for i in range(0, size, CHUNK):
        bank.add(data[i : i + CHUNK], "success", source="import")
    spent = time.perf_counter() - started
    rss = proc_status("VmRSS") - before
    size_mb = index_bytes(bank._index) / 2**20
    log(f"{size} x {dim}: hnsw built in {spent:.1f}s")
    index = bank._index
    for ef in options.ef:
        # Bound at definition: each closure keeps its own efSearch.
        def through_bank(ef: int = ef) -> None:
            faiss.omp_set_num_threads(os.cpu_count() or 1)  # the bank pins one thread itself, per call
            bank.ef_search = ef

        def bare(ef: int = ef) -> None:
            faiss.omp_set_num_threads(1)
            bank.ef_search = ef

        targets.append(Target(f"hnsw ef={ef}", through_bank, lambda q: [n.id for n in bank.search(q, K)]))
        targets.append(Target(f"hnsw ef={ef} bare", bare, lambda q: index.search(q[None, :], K)[1][0].tolist()))
        meta[f"hnsw ef={ef}"] = {"insert_per_s": size / spent, "rss_mb": rss / 2**20, "index_mb": size_mb}

    if options.nprobe:
        # The usual 4 sqrt(n) lists, but no more than k-means can train well (39 points per list).
        nlist = max(16, min(4096, int(4 * np.sqrt(size)), size // 39) // 16 * 16)
        quantizer = faiss.IndexFlatIP(dim)
        ivf = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        before = proc_status("VmRSS")
        started = time.perf_counter()
        ivf.train(data[np.random.default_rng(3).choice(size, min(size, 40 * nlist), replace=False)])
        ivf.add(data)
        spent = time.perf_counter() - started
        rss = proc_status("VmRSS") - before
        ivf_mb = index_bytes(ivf) / 2**20
        for nprobe in options.nprobe:

            def probe(nprobe: int = nprobe) -> None:
                faiss.omp_set_num_threads(1)
                ivf.nprobe = nprobe

            name = f"ivf-flat nlist={nlist} nprobe={nprobe}"
            targets.append(Target(name, probe, lambda q: ivf.search(q[None, :], K)[1][0].tolist()))
            meta[name] = {"insert_per_s": size / spent, "rss_mb": rss / 2**20, "index_mb": ivf_mb, "bare": True}

    measured = rotate(targets, queries)
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    for name, extra in meta.items():
        samples, found = measured[name]
        p50, p99 = percentiles(samples)
        bare_samples = measured.get(f"{name} bare", (samples, found))[0]
        rows.append(
            row(
                size,
                dim,
                name,
                **extra,
                p50_ms=p50,
                p99_ms=p99,
                faiss_p50_ms=percentiles(bare_samples)[0],
                recall=recall(found, truth),
                queries=len(queries),
            )
        )
    return rows


# -- driver ------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[bench_leash {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| vectors | dim | index | insert (vec/s) | RSS Δ (MiB) | index (MiB) | p50 (ms) | p99 (ms) | faiss p50 (ms) |"
        " recall@10 | queries |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['size']:,} | {r['dim']} | {r['index']} | {r['skipped']} | | | | | | | |")
            continue
        name = r["index"] + (" (bare faiss)" if r.get("bare") else "")
        lines.append(
            f"| {r['size']:,} | {r['dim']} | {name} | {r['insert_per_s']:,.0f} | {r['rss_mb']:,.0f} |"
            f" {r['index_mb']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['faiss_p50_ms']:.3f} |"
            f" {r['recall']:.3f} | {r['queries']} |"
        )
    return "\n".join(lines)


def machine() -> str:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{machine_line()}, {memory:.0f} GiB RAM, faiss {faiss.__version__}, numpy {np.__version__}"


def ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--sizes", type=ints, default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--dims", type=ints, default=[1024, 2560])
    parser.add_argument("--approx-max", type=int, default=100_000, help="largest size given approximate indexes")
    parser.add_argument("--ef", type=ints, default=[16, 32, 64, 128], help="HNSW efSearch values (bank rows)")
    parser.add_argument("--nprobe", type=ints, default=[8, 32], help="IVF-Flat nprobe values; empty: no IVF")
    parser.add_argument("--queries", type=int, default=1000, help="held-out queries per approximate index")
    parser.add_argument("--exact-budget-s", type=float, default=10.0, help="rough time for exact queries")
    parser.add_argument("--data", choices=["clustered", "steps"], default="clustered")
    parser.add_argument("--one", nargs=2, type=int, metavar=("SIZE", "DIM"), help=argparse.SUPPRESS)
    options = parser.parse_args()

    if options.one:
        print(json.dumps(run_one(options.one[0], options.one[1], options)))
        return

    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    for dim in options.dims:
        for size in options.sizes:
            # A module of the uninstalled `bench` package: it runs from the repository root.
            command = [sys.executable, "-m", "bench.leash", "--one", str(size), str(dim)]
            command += ["--approx-max", str(options.approx_max), "--queries", str(options.queries)]
            command += ["--ef", ",".join(map(str, options.ef)), "--nprobe", ",".join(map(str, options.nprobe))]
            command += ["--exact-budget-s", str(options.exact_budget_s), "--data", options.data]
            log(f"{size} x {dim}: starting")
            result = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False, cwd=REPO)
            if result.returncode != 0:
                rows.append(row(size, dim, "-", skipped=f"failed: exit {result.returncode} (out of memory?)"))
                continue
            measured = json.loads(result.stdout.strip().splitlines()[-1])
            rows.extend(measured)
            if "skipped" in measured[0] and size // 2 >= 10_000:
                # Measure what fits: the same configuration at half the size.
                half = [*command[:3], str(size // 2), *command[4:]]
                log(f"{size // 2} x {dim}: starting (half of the skipped size)")
                result = subprocess.run(half, stdout=subprocess.PIPE, text=True, check=False)
                if result.returncode == 0:
                    rows.extend(json.loads(result.stdout.strip().splitlines()[-1]))
    print(table(rows))
    print()
    print(
        f"data: {options.data}; HNSW M={HNSW_M}, efConstruction={EF_CONSTRUCTION}; k={K};"
        f" total {time.perf_counter() - started:.0f} s; 1-minute load average {load_before:.1f} before,"
        f" {os.getloadavg()[0]:.1f} after; {machine()}"
    )
    print("LEASH_BENCH " + json.dumps({"data": options.data, "machine": machine(), "rows": rows}))


if __name__ == "__main__":
    main()
