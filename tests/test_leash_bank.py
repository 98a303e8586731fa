"""LEASH banks: labelled vectors in FAISS, failure scores, crash-safe persistence, the switch to HNSW."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest

from mcp_spec_proxy.leash import bank as bank_module
from mcp_spec_proxy.leash.bank import MANIFEST, Bank, BankError, BankMismatch
from mcp_spec_proxy.leash.encoders import EncoderInfo, HashingEncoder, StepView
from mcp_spec_proxy.leash.storage import Label

pytestmark = pytest.mark.anyio

DIM = 8
INFO = EncoderInfo("hashing", "test-scheme", DIM)


def unit(*values: float) -> np.ndarray:
    vector = np.zeros(DIM, dtype=np.float32)
    vector[: len(values)] = values
    return vector / np.linalg.norm(vector)


def basis(i: int) -> np.ndarray:
    vector = np.zeros(DIM, dtype=np.float32)
    vector[i] = 1.0
    return vector


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file() and p.name != ".lock"}


def open_bank(directory: Path, **options: Any) -> Bank:
    options.setdefault("kind", "step")
    options.setdefault("encoder", INFO)
    return Bank.open(directory, **options)


def filled(directory: Path) -> Bank:
    bank = open_bank(directory)
    bank.add(np.stack([basis(0), basis(1), basis(2)]), ["success", "failure", "success"], source="verdict")
    bank.save()
    return bank


# -- add, search, failure score ----------------------------------------------------------------


def test_search_finds_the_known_neighbours_in_order() -> None:
    bank = Bank.in_memory(kind="step", encoder=INFO)
    ids = bank.add(
        np.stack([unit(1, 0), unit(1, 1), unit(0, 1), unit(-1, 0)]),
        ["success", "failure", "failure", "success"],
        source="verdict",
        metadata=[{"tool": "a"}, {"tool": "b"}, None, {"tool": "d"}],
    )
    assert ids == [0, 1, 2, 3]
    found = bank.search(unit(1, 0.2), k=3)
    assert [n.id for n in found] == [0, 1, 2]
    assert found[0].score == pytest.approx(float(unit(1, 0.2) @ unit(1, 0)), abs=1e-6)
    assert [n.label for n in found] == ["success", "failure", "failure"]
    assert found[0].metadata == {"tool": "a"} and found[2].metadata == {}
    assert found[0].source == "verdict"
    assert len(bank.search(unit(1, 0), k=50)) == 4


async def test_async_wrappers_run_the_same_operations() -> None:
    bank = Bank.in_memory(kind="step", encoder=INFO)
    assert await bank.aadd(np.stack([basis(0), basis(1)]), ["failure", "success"], source="verdict") == [0, 1]
    assert [n.id for n in await bank.asearch(basis(1), k=1)] == [1]
    await bank.asave()  # in memory: nothing to write


def test_search_restores_the_callers_openmp_threads() -> None:
    bank = Bank.in_memory(kind="step", encoder=INFO)
    bank.add(basis(0), "success", source="verdict")
    before = faiss.omp_get_max_threads()
    bank.search(basis(0))
    assert faiss.omp_get_max_threads() == before


def test_add_refuses_what_it_cannot_store() -> None:
    bank = Bank.in_memory(kind="step", encoder=INFO)
    with pytest.raises(ValueError, match="3 dims, this bank holds 8"):
        bank.add(np.ones((1, 3)), "success", source="verdict")
    with pytest.raises(ValueError, match="labels"):
        bank.add(basis(0), "maybe", source="verdict")  # type: ignore[arg-type]  # the wrong label is the test
    with pytest.raises(ValueError, match="source"):
        bank.add(basis(0), "success", source="gossip")
    with pytest.raises(ValueError, match="JSON"):
        bank.add(basis(0), "success", source="verdict", metadata={"at": object()})
    with pytest.raises(ValueError, match="finite"):
        bank.add(np.full(DIM, np.nan), "success", source="verdict")
    assert len(bank) == 0


def test_stats_count_labels_and_sources() -> None:
    bank = Bank.in_memory(kind="step", encoder=INFO)
    bank.add(np.stack([basis(0), basis(1)]), "failure", source="verdict")
    bank.add(basis(2), "success", source="import")
    stats = bank.stats()
    assert stats["count"] == 3 and stats["failures"] == 2 and stats["successes"] == 1
    assert stats["by_source"] == {"verdict": 2, "outcome": 0, "import": 1}
    assert stats["index"] == "flat" and stats["encoder"] == {"name": "hashing", "model": "test-scheme", "dim": DIM}


async def test_hashing_encoder_and_bank_together_flag_a_step_like_past_failures() -> None:
    encoder = HashingEncoder(dim=256)
    failed = [StepView("fs__delete", {"path": f"/srv/data/{n}"}, "permission denied") for n in "abc"]
    passed = [StepView("fs__read", {"path": f"/srv/data/{n}"}, "contents") for n in "abc"]
    bank = Bank.in_memory(kind="step", encoder=encoder.info)
    labels: list[Label] = ["failure" if i < 3 else "success" for i in range(6)]
    await bank.aadd(await encoder.encode_steps(failed + passed), labels, source="verdict")
    risky = await bank.asearch((await encoder.encode_steps([StepView("fs__delete", {"path": "/srv/x"})]))[0], k=3)
    safe = await bank.asearch((await encoder.encode_steps([StepView("fs__read", {"path": "/srv/x"})]))[0], k=3)
    assert [n.label for n in risky] == ["failure"] * 3 and [n.label for n in safe] == ["success"] * 3


# -- persistence -------------------------------------------------------------------------------


def test_a_new_bank_pins_its_encoder_on_disk_at_once(tmp_path: Path) -> None:
    open_bank(tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / MANIFEST).read_text())
    assert manifest["encoder"] == INFO.as_json() and manifest["count"] == 0 and manifest["kind"] == "step"
    with pytest.raises(BankMismatch):
        open_bank(tmp_path / "b", encoder=EncoderInfo("hashing", "test-scheme", 16))


def test_persistence_round_trip(tmp_path: Path) -> None:
    bank = open_bank(tmp_path)
    bank.add(np.stack([unit(1, 0), unit(1, 1)]), ["success", "failure"], source="verdict", metadata={"run": "r1"})
    bank.add(unit(0, 1), "failure", source="outcome", metadata=[{"task": "refund", "n": [1, 2]}])
    bank.save()
    again = open_bank(tmp_path)
    assert len(again) == 3
    assert again.stats() | {"generation": 0} == bank.stats() | {"generation": 0}
    before = [(n.id, n.label, n.source, n.metadata) for n in bank.search(unit(1, 0.5))]
    after = [(n.id, n.label, n.source, n.metadata) for n in again.search(unit(1, 0.5))]
    assert after == before
    assert again.search(unit(0, 1), k=1)[0].metadata == {"task": "refund", "n": [1, 2]}
    again.add(basis(3), "success", source="import")
    again.save()
    assert len(open_bank(tmp_path)) == 4


def test_a_save_writes_only_the_new_rows_and_segments_stay_few(tmp_path: Path) -> None:
    bank = open_bank(tmp_path)
    bank.add(np.tile(basis(0), (64, 1)), "success", source="import")
    bank.save()
    first = json.loads((tmp_path / MANIFEST).read_text())["files"]["segments"]
    assert [(x["start"], x["end"]) for x in first] == [(0, 64)]
    bank.add(basis(1), "failure", source="verdict")
    bank.save()
    segments = json.loads((tmp_path / MANIFEST).read_text())["files"]["segments"]
    assert segments[0] == first[0]  # untouched
    assert [(x["start"], x["end"]) for x in segments] == [(0, 64), (64, 65)]
    for i in range(2, 40):
        bank.add(basis(i % DIM), "failure" if i % 2 else "success", source="verdict")
        bank.save()
    segments = json.loads((tmp_path / MANIFEST).read_text())["files"]["segments"]
    spans = [(x["start"], x["end"]) for x in segments]
    assert spans[0] == (0, 64) and spans[-1][1] == 103
    assert len(spans) <= 7  # one per set bit of the 39 rows added one at a time, plus the import
    on_disk = {p.name for p in tmp_path.glob("*-*.*")}
    assert on_disk == {x[role]["name"] for x in segments for role in ("vectors", "meta")}  # merged ones are gone
    again = open_bank(tmp_path)
    assert len(again) == 103 and again.stats() | {"generation": 0} == bank.stats() | {"generation": 0}
    assert [n.id for n in again.search(basis(1), k=3)] == [n.id for n in bank.search(basis(1), k=3)]


def test_save_without_changes_writes_nothing(tmp_path: Path) -> None:
    bank = filled(tmp_path)
    before = snapshot(tmp_path)
    bank.save()
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("other", "named"),
    [
        (EncoderInfo("hashing", "test-scheme", 16), "16 dims"),
        (EncoderInfo("hashing", "other-scheme", DIM), "'other-scheme'"),
        (EncoderInfo("embedding", "test-scheme", DIM), "embedding encoder"),
    ],
)
def test_a_bank_made_by_another_encoder_is_refused_naming_both(tmp_path: Path, other: EncoderInfo, named: str) -> None:
    filled(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(BankMismatch) as raised:
        open_bank(tmp_path, encoder=other)
    message = str(raised.value)
    assert "hashing encoder 'test-scheme' (8 dims)" in message and named in message
    assert str(tmp_path) in message
    assert snapshot(tmp_path) == before


def test_a_bank_of_the_other_kind_is_refused(tmp_path: Path) -> None:
    filled(tmp_path)
    with pytest.raises(BankMismatch, match="holds steps, not tasks"):
        open_bank(tmp_path, kind="task")


def test_an_embedding_bank_learns_its_dimension_from_the_first_vectors(tmp_path: Path) -> None:
    unknown = EncoderInfo("embedding", "e5", 0)
    bank = open_bank(tmp_path, encoder=unknown)
    assert bank.search(np.ones(5)) == []
    bank.add(np.ones((2, 5)), "success", source="verdict")
    bank.save()
    assert bank.encoder.dim == 5
    assert len(open_bank(tmp_path, encoder=unknown)) == 2
    assert open_bank(tmp_path, encoder=EncoderInfo("embedding", "e5", 5)).encoder.dim == 5
    with pytest.raises(BankMismatch):
        open_bank(tmp_path, encoder=EncoderInfo("embedding", "e5", 6))


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda d: (d / MANIFEST).write_text("{not json"), MANIFEST),
        (lambda d: (d / MANIFEST).write_text(json.dumps({"format": "other"})), MANIFEST),
        (lambda d: _flip_last_byte(next(d.glob("vectors-*.npy"))), "vectors-000002.npy"),
        (lambda d: next(d.glob("meta-*.jsonl")).write_text("garbage\n"), "meta-000002.jsonl"),
        (lambda d: next(d.glob("meta-*.jsonl")).unlink(), "meta-000002.jsonl"),
    ],
)
def test_a_corrupt_bank_is_reported_and_never_replaced(tmp_path: Path, damage: Any, named: str) -> None:
    filled(tmp_path)
    damage(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(BankError) as raised:
        open_bank(tmp_path)
    message = str(raised.value)
    assert named in message and "move them aside" in message.lower() and str(tmp_path) in message
    assert not isinstance(raised.value, BankMismatch)
    assert snapshot(tmp_path) == before


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


class Killed(BaseException):
    """Stands for the process dying: not an Exception, so nothing on the way may catch it."""


@pytest.mark.parametrize("dies_at_rename", [1, 2, 3])
def test_a_crash_between_write_and_rename_leaves_the_previous_bank_loadable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dies_at_rename: int
) -> None:
    bank = filled(tmp_path)
    bank.add(basis(5), "failure", source="verdict")
    real_replace = os.replace
    renames: list[str] = []

    def replace_then_die(src: Any, dst: Any) -> None:
        renames.append(Path(dst).name)
        if len(renames) == dies_at_rename:
            raise Killed
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(Killed):
        bank.save()
    monkeypatch.setattr(os, "replace", real_replace)
    # Data files go first, the manifest last: its rename is the commit.
    assert renames == ["vectors-000003.npy", "meta-000003.jsonl", MANIFEST][:dies_at_rename]

    survivor = open_bank(tmp_path)
    assert len(survivor) == 3
    assert [n.id for n in survivor.search(basis(1), k=1)] == [1]
    assert not any(p.name.startswith(".") and p.name != ".lock" for p in tmp_path.iterdir())  # no temp files left
    # Files of the unfinished generation are reported, not used.
    abandoned = sorted(survivor.stats().get("abandoned_files", []))
    assert abandoned == sorted(["vectors-000003.npy", "meta-000003.jsonl"][: dies_at_rename - 1])

    # The interrupted bank is still whole in memory; saving again commits it and sweeps the leftovers.
    bank.save()
    assert len(open_bank(tmp_path)) == 4
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {
        MANIFEST,
        ".lock",
        "vectors-000002.npy",
        "meta-000002.jsonl",
        "vectors-000003.npy",
        "meta-000003.jsonl",
    }


def test_a_disk_error_during_save_is_a_bank_error_and_keeps_the_previous_generation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bank = filled(tmp_path)
    bank.add(basis(5), "failure", source="verdict")

    def full_disk(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(BankError, match="No space left on device; generation 2 is still the one on disk"):
        bank.save()
    monkeypatch.undo()
    assert len(open_bank(tmp_path)) == 3


def test_a_bank_saved_by_another_process_is_merged_not_overwritten(tmp_path: Path) -> None:
    first = filled(tmp_path)
    second = open_bank(tmp_path)
    second.add(basis(6), "success", source="verdict")
    second.save()
    first.add(basis(7), "failure", source="verdict")
    first.save()  # takes in the other process's row, then adds its own
    assert len(open_bank(tmp_path)) == 5


# -- approximate index -------------------------------------------------------------------------


def clustered(count: int, dim: int, centres: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    middle = rng.standard_normal((centres, dim)).astype(np.float32)
    points = middle[rng.integers(0, centres, count)] + 0.3 * rng.standard_normal((count, dim)).astype(np.float32)
    unit: np.ndarray = points / np.linalg.norm(points, axis=1, keepdims=True)
    return unit


def test_past_approximate_after_the_bank_switches_to_hnsw_and_still_finds_exact_neighbours(tmp_path: Path) -> None:
    dim = 32
    info = EncoderInfo("hashing", "test-scheme", dim)
    vectors = clustered(600, dim, centres=30, seed=1)
    labels: list[Any] = ["failure" if i % 3 == 0 else "success" for i in range(600)]
    bank = open_bank(tmp_path, encoder=info, approximate_after=400)
    bank.add(vectors[:400], labels[:400], source="import")
    assert bank.stats()["index"] == "flat"
    bank.add(vectors[400:], labels[400:], source="import")
    stats = bank.stats()
    assert stats["index"] == "hnsw" and bank.approximate
    assert stats["recall_at_10"] >= 0.95 and stats["recall_sample"] == 200 and stats["recall_measured_at"] == 600

    exact = faiss.IndexFlatIP(dim)
    exact.add(vectors)
    queries = clustered(20, dim, centres=30, seed=1)  # same centres (same seed), fresh noise
    queries = queries + 0.05 * np.random.default_rng(9).standard_normal(queries.shape).astype(np.float32)
    _, truth = exact.search(np.ascontiguousarray(queries / np.linalg.norm(queries, axis=1, keepdims=True)), 5)
    hits = sum(len(set(truth[i]) & {n.id for n in bank.search(q, k=5)}) for i, q in enumerate(queries))
    assert hits / truth.size >= 0.95

    bank.save()
    assert any(tmp_path.glob("index-*.faiss"))
    # A few more vectors do not rewrite the graph; loading adds them to it.
    graph = next(tmp_path.glob("index-*.faiss")).name
    bank.add(vectors[:5], "failure", source="verdict")
    bank.save()
    assert next(tmp_path.glob("index-*.faiss")).name == graph
    twins = open_bank(tmp_path, encoder=info, approximate_after=400).search(vectors[2], k=2)
    assert {n.id for n in twins} == {2, 602} and {n.label for n in twins} == {"success", "failure"}
    reloaded = open_bank(tmp_path, encoder=info, approximate_after=400)
    assert reloaded.stats()["index"] == "hnsw" and reloaded.stats()["recall_at_10"] == round(stats["recall_at_10"], 4)
    assert len(reloaded) == 605
    assert [n.id for n in reloaded.search(queries[0])] == [n.id for n in bank.search(queries[0])]
    # A higher threshold turns the same files back into an exact bank.
    assert open_bank(tmp_path, encoder=info, approximate_after=10_000).stats()["index"] == "flat"
    # A lower one builds the graph on load.
    assert open_bank(tmp_path, encoder=info, approximate_after=100).stats()["index"] == "hnsw"


def test_lookups_and_adds_go_on_while_the_graph_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    info = EncoderInfo("hashing", "test-scheme", 16)
    bank = Bank.in_memory(kind="step", encoder=info, approximate_after=50)
    vectors = clustered(80, 16, centres=4, seed=3)
    bank.add(vectors[:50], "success", source="import")
    real_recall = bank_module._recall
    during: list[Any] = []

    def recall_then_use_the_bank(*args: Any) -> Any:
        # Runs between the graph build and the swap: the lock must be free, the exact index in use.
        during.append((bank.approximate, [n.id for n in bank.search(vectors[0], k=1)]))
        during.append(bank.add(vectors[60:], "failure", source="verdict"))
        return real_recall(*args)

    monkeypatch.setattr(bank_module, "_recall", recall_then_use_the_bank)
    bank.add(vectors[50:60], "success", source="import")
    assert during == [(False, [0]), list(range(60, 80))]
    assert bank.approximate and len(bank) == 80
    assert bank.search(vectors[70], k=1)[0].id == 70  # added mid-build, found in the graph


def test_by_default_the_bank_goes_approximate_where_an_exact_scan_gets_slow() -> None:
    assert Bank.in_memory(kind="step", encoder=EncoderInfo("hashing", "x", 1024)).approximate_after == 4096
    assert Bank.in_memory(kind="step", encoder=EncoderInfo("hidden", "x", 2560)).approximate_after == 1638
    unknown = Bank.in_memory(kind="step", encoder=EncoderInfo("embedding", "x", 0))
    assert unknown.stats()["approximate_after"] is None
    unknown.add(np.ones((1, 2048)), "success", source="verdict")
    assert unknown.approximate_after == 2048


def test_ef_search_can_be_tuned_on_an_hnsw_bank() -> None:
    info = EncoderInfo("hashing", "test-scheme", 16)
    bank = Bank.in_memory(kind="step", encoder=info, approximate_after=0, ef_search=16)
    bank.add(clustered(100, 16, centres=5, seed=2), "success", source="import")
    bank.ef_search = 64
    assert bank.stats()["hnsw"]["ef_search"] == 64
    assert len(bank.search(np.ones(16), k=10)) == 10
