"""The tests' pgvector runs on any CPU, and a pgvector that cannot is named in one line.

The embedded PostgreSQL's wheel ships a vector.so built with -march=native on an AVX-512 machine;
scripts/portable-pgvector.sh (run by scripts/test.sh) rebuilds it with pgvector's portable flags.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from pathlib import Path

import psycopg
import pytest

from mcp_spec_proxy.errors import StateError
from mcp_spec_proxy.store.migrations import MIGRATIONS, check_vector
from mcp_spec_proxy.store.postgres import migrate_database

pytestmark = pytest.mark.anyio

# Kernels pgvector compiles for wider instruction sets and picks by cpuid at run time
# (gcc's target_clones suffixes, and its own dispatched F16C / AVX-512 popcount functions).
DISPATCHED = re.compile(r"\.(fma|avx\w*|f16c|popcnt)(\.\w+)?$|F16c|Avx512")
WIDE = re.compile(r"%[yz]mm\d+")


def installed_vector_so() -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs' import-time warning, as in tests/pg.py
        import pgserver

    return Path(pgserver.__file__).parent / "pginstall" / "lib" / "postgresql" / "vector.so"


def wide_functions(so: Path) -> dict[str, int]:
    """Each function of `so` that touches a ymm or zmm register (AVX, AVX2, AVX-512): how often."""
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils) is needed to read vector.so: apt-get install binutils"
    listing = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(so)], capture_output=True, text=True, check=True)
    found: dict[str, int] = {}
    function = "?"
    for line in listing.stdout.splitlines():
        if header := re.match(r"^[0-9a-f]+ <(.+)>:$", line):
            function = header.group(1)
        elif WIDE.search(line):
            found[function] = found.get(function, 0) + 1
    return found


@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="AVX is an x86-64 instruction set")
def test_the_tests_pgvector_uses_wide_vector_instructions_only_where_it_dispatches_on_cpuid() -> None:
    so = installed_vector_so()
    undispatched = {name: n for name, n in wide_functions(so).items() if not DISPATCHED.search(name)}
    assert not undispatched, (
        f"{so} runs AVX/AVX-512 instructions unconditionally in {sorted(undispatched)}: it dies with SIGILL"
        " on a CPU without them; run scripts/portable-pgvector.sh"
    )


async def test_a_working_pgvector_passes_the_check_at_migration(pg_dsn: str) -> None:
    assert await migrate_database(pg_dsn, 5, leash=True) == [m.version for m in MIGRATIONS]
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await check_vector(conn)


async def test_a_pgvector_that_kills_its_server_process_is_named_in_one_line(pg_dsn: str) -> None:
    """The probe's server process dies as an AVX-512 build's does on a CPU without it (here it is
    terminated, which the client sees the same way: the connection is gone mid-query)."""
    await migrate_database(pg_dsn, 5, leash=True)
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        with pytest.raises(StateError) as raised:
            await check_vector(conn, probe="SELECT pg_terminate_backend(pg_backend_pid())")
    message = str(raised.value)
    assert "\n" not in message
    assert "crashed its server computing a distance" in message and 'OPTFLAGS=""' in message


async def test_a_pgvector_that_computes_wrong_distances_is_refused(pg_dsn: str) -> None:
    await migrate_database(pg_dsn, 5, leash=True)
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        with pytest.raises(StateError, match="computes wrong distances"):
            await check_vector(conn, probe="SELECT 0.0, 0.0, 0.0")
