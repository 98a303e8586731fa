"""LEASH banks in pgvector: every replica's labels in one table, a bank still one encoder's."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import psycopg
import pytest

from mcp_spec_proxy.leash.encoders import EncoderInfo
from mcp_spec_proxy.leash.pgvector import PgBank
from mcp_spec_proxy.leash.storage import BankError, BankMismatch, Kind, Label
from mcp_spec_proxy.store.postgres import migrate_database
from mcp_spec_proxy.testing import ChatRequest, Respond, ScriptedModelServer
from tests.harness import recorded, segment_length, text_of, toy, verdict
from tests.pg import replica, rows
from tests.test_store_replicas import client

pytestmark = pytest.mark.anyio

HASHING = EncoderInfo("hashing", "hashing-v1", 16)


async def test_labels_added_through_one_bank_are_neighbours_through_another(pg_dsn: str) -> None:
    await migrate_database(pg_dsn, 5, leash=True)
    a, b = PgBank(pg_dsn, kind="step", encoder=HASHING), PgBank(pg_dsn, kind="step", encoder=HASHING)
    try:
        rng = np.random.default_rng(7)
        vectors = rng.normal(size=(50, 16)).astype(np.float32)
        labels: list[Label] = ["failure" if i < 10 else "success" for i in range(50)]
        ids = a.add(vectors, labels, source="verdict", metadata={"tool": "t"})
        found = b.search(vectors[3], k=5)
        assert len(ids) == 50 and b.count == 50
        assert found[0].id == ids[3] and found[0].label == "failure"
        assert found[0].score == pytest.approx(1.0, abs=1e-5)
        assert [n.score for n in found] == sorted((n.score for n in found), reverse=True)
        assert found[0].metadata == {"tool": "t"}
        with pytest.raises(ValueError, match="16"):
            b.add(np.ones((1, 8), dtype=np.float32), "success", source="verdict")
        with pytest.raises(BankMismatch, match="hashing encoder"):
            PgBank(pg_dsn, kind="step", encoder=EncoderInfo("embedding", "other-model", 16))
        assert b.stats()["failures"] == 10
    finally:
        a.close()
        b.close()


async def test_a_verdicts_labels_on_replica_a_are_the_neighbours_of_a_lookup_on_replica_b(
    tmp_path: Path, pg_dsn: str
) -> None:
    """A's reviewer rejects a call and A labels it a failure; on B the same call, under `allow`,
    meets LEASH's shadow observer, which finds A's label and sends the call to review after all."""
    reviewed: list[int] = []

    def reject(request: ChatRequest) -> str:
        reviewed.append(segment_length(request))
        return verdict(0, "never this")

    ledger = tmp_path / "ledger"
    async with ScriptedModelServer(Respond(reject)) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0, "model": "strong-model"}
        leash: dict[str, Any] = {"encoder": "hashing", "dim": 256, "min_neighbours": 1, "min_similarity": 0.99}
        base = {"servers": {"toy": toy(ledger)}, "models": {"strong": endpoint}}
        # Each replica its own bank_dir: only the database can carry A's label to B.
        on_a = {**base, "leash": {**leash, "bank_dir": str(tmp_path / "a-banks")}, "review": {"default": "strong"}}
        on_b = {**base, "leash": {**leash, "bank_dir": str(tmp_path / "b-banks")}, "review": {"default": "allow"}}
        for config in (on_a, on_b):
            config["review"]["intent"] = False
        with replica(on_a, tmp_path, pg_dsn, "a") as a:
            with anyio.fail_after(60):
                async with client(a.url, "s-a") as c:
                    first = await c.call_tool("toy__record", {"value": "drop table users"})
        labelled = rows(pg_dsn, "SELECT label FROM bank_vectors WHERE bank = 'step'")
        with replica(on_b, tmp_path, pg_dsn, "b") as b:
            with anyio.fail_after(60):
                async with client(b.url, "s-b") as c:
                    fine = await c.call_tool("toy__record", {"value": "a harmless note about tea"})
                    second = await c.call_tool("toy__record", {"value": "drop table users"})
    assert first.is_error and second.is_error, (text_of(first), text_of(second))
    assert labelled == [("failure",)]
    assert not fine.is_error  # nothing near it in the bank: `allow` forwards it
    assert recorded(ledger) == ['{"value": "a harmless note about tea"}']
    assert len(reviewed) == 2  # A's review, and B's escalation
    escalated = rows(pg_dsn, "SELECT data->>'to' FROM audit WHERE event = 'leash-escalated'")
    assert escalated == [("strong",)]


async def test_two_replicas_creating_one_bank_at_once_both_keep_their_labels(pg_dsn: str) -> None:
    """The first vectors of a bank create its index; two replicas doing that at once lost labels
    (the second `CREATE INDEX IF NOT EXISTS` failed on the index's name) in 7 trials of 10."""
    await migrate_database(pg_dsn, 5, leash=True)
    for trial in range(10):
        kind: Kind = "step" if trial % 2 else "task"
        with psycopg.connect(pg_dsn, autocommit=True) as conn:  # a bank no replica has made yet
            conn.execute("DELETE FROM bank_vectors")
            conn.execute("DELETE FROM banks")
            conn.execute(f"DROP INDEX IF EXISTS bank_vectors_{kind}_hnsw")
        banks = [PgBank(pg_dsn, kind=kind, encoder=HASHING) for _ in range(2)]
        failures: list[BaseException] = []

        def add(bank: PgBank, label: Label, failures: list[BaseException] = failures) -> None:
            try:
                bank.add(np.ones((1, 16), dtype=np.float32), label, source="verdict")
            except BaseException as exc:  # what fails is the point
                failures.append(exc)

        try:
            with anyio.fail_after(60):
                async with anyio.create_task_group() as tg:
                    both: tuple[Label, Label] = ("success", "failure")
                    for bank, label in zip(banks, both, strict=True):
                        tg.start_soon(partial(anyio.to_thread.run_sync, add, bank, label))
        finally:
            for bank in banks:
                bank.close()
        assert failures == [], (trial, failures)
        stored = rows(pg_dsn, "SELECT label FROM bank_vectors WHERE bank = %s ORDER BY label", (kind,))
        assert stored == [("failure",), ("success",)], trial


def test_a_bank_on_a_database_never_migrated_says_how_to_migrate(pg_dsn: str) -> None:
    bank = PgBank(pg_dsn, kind="task", encoder=HASHING)  # `check` opens it before any replica started
    try:
        with pytest.raises(BankError, match="store migrate"):
            bank.add(np.ones((1, 16), dtype=np.float32), "success", source="verdict")
    finally:
        bank.close()
