"""LEASH's three layers over the banks: route the task, escalate a drafted step, observe the rest.

`Leash` holds the encoder and the two banks (task-level: did the weak model succeed at a task
like this; step-level: was a drafted step like this accepted by the verifier) and turns their
nearest neighbours into decisions:

* **routing** — before the first step, a task whose neighbours mostly failed goes strong-led;
* **step escalation** — a drafted read whose neighbours are mostly rejected steps ends the
  draft early and goes to verification, so the weak model stops drafting a doomed segment;
* **shadow observer** — a step nobody would review (strong-led, or a write under `allow` at the
  MCP front) that looks like past failures is reviewed after all, and the decision is logged.

A score needs `min_neighbours` labelled neighbours; with fewer there is no opinion and the
ordinary path runs. Labels come for free: every verdict labels its segment (the accepted prefix
succeeded, the first rejected step failed), and `report_outcome` labels a whole task. Each label
carries its provenance (`calls/provenance.py`), and one session stores at most
`leash.labels_per_session_hour` labels in each bank per hour: the rest are dropped, logged once.

LEASH advises; it never breaks the call it advises on. Every method the barrier, the gate and the
engine call (`task_score`, `step_score`, the `label_*` methods, `remember`, and all of `LeashWatch`)
is `advisory` (`advisory.py`): an exception inside it — FAISS, a bank that will not load or save, an embedding
endpoint that is down, a hidden state of the wrong size — is logged once (and again only when it
changes, and once more when it clears) and becomes "no evidence" (`Score(None, ())`, `False`) or a
label not stored. The call then goes the ordinary way. Operator commands (`bank import`,
`bank calibrate`) open a `strict` Leash, where the same exceptions propagate.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
import numpy as np

from mcp_spec_proxy.config.schema import LeashConfig
from mcp_spec_proxy.leash.advisory import Guard, advisory, no, nothing, uncalibrated, zero
from mcp_spec_proxy.leash.bank import Bank, Label, Neighbour
from mcp_spec_proxy.leash.calibrate import Calibration, flags
from mcp_spec_proxy.leash.encoders import (
    EmbeddingEncoder,
    Encoder,
    HashingEncoder,
    HiddenStateEncoder,
)
from mcp_spec_proxy.leash.provenance import Provenance
from mcp_spec_proxy.leash.steps import Row, drafted_rows, view
from mcp_spec_proxy.observe.telemetry import Telemetry
from mcp_spec_proxy.trajectory import Step

logger = logging.getLogger(__name__)

RUNS_KEPT = 10_000
RATE_WINDOW_S = 3600.0  # `labels_per_session_hour`
_LIMITED_KEPT = 10_000  # sessions told they hit the rate limit, remembered so each is logged once


@dataclass(frozen=True)
class Score:
    """A failure score in [0, 1] from the k nearest labelled neighbours, or None: too few to judge."""

    value: float | None
    neighbours: tuple[Neighbour, ...]
    # Under `hidden`, what stood for the step (`Representation`, or `fallback`): telemetry and audit say it.
    representation: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "score": None if self.value is None else round(self.value, 4),
            "neighbours": [
                {"id": n.id, "similarity": round(float(n.score), 4), "label": n.label, "source": n.source}
                for n in self.neighbours[:5]
            ],
            **({"representation": self.representation} if self.representation else {}),
        }


def _no_score() -> Score:
    return Score(None, ())


def _fallback(config: LeashConfig, api_key: str | None) -> Encoder:
    """The configured text encoder: `embedding` (`hidden`'s fallback too where there is an endpoint), or hashing."""
    if config.embedding is not None and config.encoder != "hashing":
        return EmbeddingEncoder(config.embedding.base_url, config.embedding.model, api_key=api_key)
    return HashingEncoder(dim=config.dim)


class Leash:
    """The banks and the decisions over them.

    Under `encoder: hidden` there are two representations, each in banks of its own, each the same
    at labelling and lookup: a weak-drafted step is its drafting call's state (`steps`, no extra
    pass); a task, and a step no weak call drafted (strong-led, a client's), is the fallback
    encoder's vector of its text (`text_encoder`: `leash.embedding`, else hashing; `tasks` and
    `observed`). Every judged step is labelled in both, so the observer learns from every verdict.
    Where the weak model's server returns no states, the fallback encodes everything (`stand_in`).
    """

    def __init__(
        self,
        config: LeashConfig,
        encoder: Encoder,
        tasks: Bank,
        steps: Bank,
        *,
        telemetry: Telemetry | None = None,
        strict: bool = False,
        text_encoder: Encoder | None = None,
        observed: Bank | None = None,
        stand_in: bool = False,
    ) -> None:
        self.config = config
        self.encoder = encoder
        self.text_encoder = text_encoder or encoder
        self.tasks = tasks
        self.steps = steps
        self.observed = observed
        # True: the fallback encodes steps where the weak model's own states were configured (`hidden`).
        self._stand_in = stand_in
        self.telemetry = telemetry or Telemetry(None)
        self._root = Path(config.bank_dir).expanduser()
        self._runs = self._root / "runs.jsonl"
        self._lock = anyio.Lock()
        self._guard = Guard(strict)
        self._limited: set[tuple[str, str]] = set()  # (bank kind, session) past the rate limit, logged

    @property
    def strict(self) -> bool:
        """True: LEASH's failures propagate (operator commands); False: they become "no evidence"."""
        return self._guard.strict

    async def aclose(self) -> None:
        """Close the encoders' connections to their endpoints (an embedding server)."""
        for encoder in {id(e): e for e in (self.encoder, self.text_encoder)}.values():
            close = getattr(encoder, "aclose", None)
            if close is not None:
                await close()

    @classmethod
    def open(
        cls,
        config: LeashConfig,
        *,
        api_key: str | None = None,
        hidden_model: str = "",
        hidden_native: bool = True,
        telemetry: Telemetry | None = None,
        strict: bool = False,
        open_bank: Callable[..., Bank] = Bank.open,
    ) -> Leash:
        """Build the configured encoder and open (or create) the banks; a bank that will not load is an error.

        `open_bank` opens each bank: `Bank.open` (files in `bank_dir`), or the Postgres store's.
        `hidden_model` names the weak model's states (`ModelConfig.hidden_state_source`);
        `hidden_native` says whether its server returns them. Under `encoder: hidden` without
        them, one line at start-up says that the fallback encoder stands in (see the class docstring).

        `strict`: LEASH's failures propagate instead of becoming "no evidence" (see the module docstring).
        """
        root = Path(config.bank_dir).expanduser()
        fallback = _fallback(config, api_key)
        if config.encoder != "hidden":
            tasks = open_bank(root / "task", kind="task", encoder=fallback.info)
            steps = open_bank(root / "step", kind="step", encoder=fallback.info)
            return cls(config, fallback, tasks, steps, telemetry=telemetry, strict=strict)
        tasks = open_bank(root / "task", kind="task", encoder=fallback.info)
        if not hidden_native:
            logger.warning(
                "LEASH encoder hidden: the weak model %s returns no hidden states, so the %s stands in for"
                " steps and tasks, over the step text the banks hold — not the zero-extra-pass mode%s",
                hidden_model or "(none configured)",
                fallback.info.describe(),
                " (no model pass at all)" if isinstance(fallback, HashingEncoder) else " (its own endpoint)",
            )
            steps = open_bank(root / "step", kind="step", encoder=fallback.info)
            return cls(config, fallback, tasks, steps, telemetry=telemetry, strict=strict, stand_in=True)
        encoder = HiddenStateEncoder(hidden_model, config.dim)
        steps = open_bank(root / "step", kind="step", encoder=encoder.info)
        observed = open_bank(root / "observed", kind="observed", encoder=fallback.info)
        return cls(
            config,
            encoder,
            tasks,
            steps,
            telemetry=telemetry,
            strict=strict,
            text_encoder=fallback,
            observed=observed,
        )

    # -- scores --------------------------------------------------------------------------------

    @advisory(_no_score)
    async def task_score(self, task: str) -> Score:
        if isinstance(self.text_encoder, HiddenStateEncoder):
            return Score(None, ())  # a Leash built without a fallback: a task has no drafting call of its own
        vector = (await self.text_encoder.encode_texts([task]))[0]
        score = await self._score(self.tasks, vector)
        return replace(score, representation="fallback") if self.config.encoder == "hidden" else score

    @advisory(_no_score)
    async def step_score(self, step: Step, hidden: Any = None) -> Score:
        found = await self._vector(step, hidden)
        if found is None:
            return Score(None, ())
        bank, vector, representation = found
        return replace(await self._score(bank, vector), representation=representation)

    async def _vector(self, step: Step, hidden: Any) -> tuple[Bank, np.ndarray, str | None] | None:
        """The bank a step is looked up in, its vector there, and what stood for it."""
        if isinstance(self.encoder, HiddenStateEncoder):
            if step.state is not None:  # the drafting call's own state, carried by the step
                return self.steps, self.encoder.from_hidden(step.state.vector), step.state.representation
            # A state handed over, or remembered for the same call, from before steps carried them.
            vector = self.encoder.from_hidden(hidden, step=view(step)) if hidden is not None else None
            vector = vector if vector is not None else self.encoder.recall(view(step))
            if vector is not None:
                return self.steps, vector, "call"
            if self.observed is None or isinstance(self.text_encoder, HiddenStateEncoder):
                return None
            # No weak call drafted it (strong-led, a client's): the fallback's space, in its own bank.
            rows: np.ndarray = await self.text_encoder.encode_steps([view(step)])
            return self.observed, rows[0], "fallback"
        vectors: np.ndarray = await self.encoder.encode_steps([view(step)])
        return self.steps, vectors[0], "fallback" if self._stand_in else None

    async def _score(self, bank: Bank, vector: np.ndarray) -> Score:
        """Similarity-weighted share of failures among the near neighbours; far ones are no evidence."""
        # No shortcut on len(bank): the search first picks up labels another process saved.
        found = await bank.asearch(vector, self.config.k)
        near = tuple(n for n in found if n.score >= self.config.min_similarity)
        if len(near) < self.config.min_neighbours:
            return Score(None, near)
        weights = [float(n.score) for n in near]
        failed = sum(w for w, n in zip(weights, near, strict=True) if n.label == "failure")
        return Score(failed / sum(weights), near)

    def at_least(self, score: Score, threshold: float) -> bool:
        """The escalation decision; `bank calibrate`'s curve is drawn with the same `flags`."""
        return flags(score.value, threshold)

    @advisory(uncalibrated)
    async def calibration(self) -> Calibration | None:
        """The calibration record `bank calibrate --max-false-accept` wrote in the bank directory, if any."""
        return await anyio.to_thread.run_sync(Calibration.load, self._root)

    # -- labels --------------------------------------------------------------------------------

    @advisory(zero)
    async def label_steps(
        self,
        steps: Sequence[Step],
        labels: Sequence[Label],
        *,
        source: str,
        hidden: Sequence[Any] | None = None,
        provenance: Provenance | None = None,
    ) -> int:
        """Store the steps' labels; how many were stored (a step with no vector, or a failure, stores
        none; a session past its hourly bound stores no more)."""
        return await self._label_steps(steps, labels, source=source, hidden=hidden, provenance=provenance)

    async def _label_steps(
        self,
        steps: Sequence[Step],
        labels: Sequence[Label],
        *,
        source: str,
        hidden: Sequence[Any] | None = None,
        provenance: Provenance | None = None,
    ) -> int:
        if not steps:
            return 0
        banked: list[tuple[Bank, list[Row]]] = []
        if isinstance(self.encoder, HiddenStateEncoder):
            rows, skipped = drafted_rows(self.encoder, steps, labels, hidden)
            banked.append((self.steps, rows))
            if skipped:
                # The turn's state is one vector for calls judged differently: it labels none of them.
                await self.telemetry.record("leash", layer="label", stored=len(rows), skipped_turn_calls=skipped)
            if self.observed is not None and not isinstance(self.text_encoder, HiddenStateEncoder):
                vectors = await self.text_encoder.encode_steps([view(step) for step in steps])
                text_rows = [
                    Row(vector, label, {"tool": step.tool, "representation": "fallback"})
                    for vector, step, label in zip(vectors, steps, labels, strict=True)
                ]
                banked.append((self.observed, text_rows))
        else:
            vectors = await self.encoder.encode_steps([view(step) for step in steps])
            extra = {"representation": "fallback"} if self._stand_in else {}
            banked.append(
                (
                    self.steps,
                    [
                        Row(v, label, {"tool": s.tool, **extra})
                        for v, s, label in zip(vectors, steps, labels, strict=True)
                    ],
                )
            )
        now = time.time()
        origin = _stamped(provenance, source)
        stored = 0
        async with self._lock:
            for bank, rows in banked:
                rows = rows[: await self._room(bank, origin, len(rows))] if rows else rows
                if not rows:
                    continue
                metadata = [{**row.metadata, "at": now} for row in rows]
                await bank.aadd(
                    np.stack([row.vector for row in rows]),
                    [row.label for row in rows],
                    source=source,
                    metadata=metadata,
                    provenance=origin,
                )
                await anyio.to_thread.run_sync(bank.save)
                if bank is self.steps:
                    stored = len(rows)
        return stored

    async def _room(self, bank: Bank, origin: Provenance, wanted: int) -> int:
        """How many of `wanted` new labels `origin`'s session may still store in `bank` this hour.

        A session is the unit an agent under review controls, so it is what is bounded: one that
        labels in bulk (look-alikes of a call it wants through) is cut off, and said so once."""
        limit = self.config.labels_per_session_hour
        session = origin.session
        if limit is None or session is None or origin.reporter == "operator":
            return wanted
        stored = await bank.alabels_since(session, time.time() - RATE_WINDOW_S)
        room = max(0, min(wanted, limit - stored))
        if room < wanted and (bank.kind, session) not in self._limited:
            if len(self._limited) >= _LIMITED_KEPT:
                self._limited.clear()
            self._limited.add((bank.kind, session))
            logger.warning(
                "LEASH %s bank: session %s reached leash.labels_per_session_hour (%d); its further labels"
                " this hour are not stored",
                bank.kind,
                session,
                limit,
            )
        return room

    @advisory(nothing)
    async def label_verdict(
        self,
        steps: Sequence[Step],
        accepted_steps: int,
        *,
        source: str = "verdict",
        provenance: Provenance | None = None,
    ) -> None:
        """The accepted prefix succeeded; the first rejected step failed; what came after says nothing."""
        labelled = list(steps[: accepted_steps + 1])
        labels: list[Label] = ["success"] * min(accepted_steps, len(steps))
        if accepted_steps < len(steps):
            labels.append("failure")
        await self._label_steps(labelled, labels, source=source, provenance=provenance)

    @advisory(no)
    async def label_task(
        self,
        task: str,
        success: bool,
        *,
        source: str = "outcome",
        meta: dict[str, Any] | None = None,
        provenance: Provenance | None = None,
    ) -> bool:
        """Store the task's label; whether it was stored."""
        return await self._label_task(task, success, source=source, meta=meta, provenance=provenance)

    async def _label_task(
        self,
        task: str,
        success: bool,
        *,
        source: str = "outcome",
        meta: dict[str, Any] | None = None,
        provenance: Provenance | None = None,
    ) -> bool:
        if isinstance(self.text_encoder, HiddenStateEncoder):
            return False  # a Leash built without a fallback: a task has no drafting call of its own
        vector = await self.text_encoder.encode_texts([task])
        label: Label = "success" if success else "failure"
        origin = _stamped(provenance, source)
        async with self._lock:
            if await self._room(self.tasks, origin, 1) == 0:
                return False
            metadata = [{"task": task[:500], **(meta or {})}]
            await self.tasks.aadd(vector, [label], source=source, metadata=metadata, provenance=origin)
            await anyio.to_thread.run_sync(self.tasks.save)
        return True

    # -- runs and outcomes ---------------------------------------------------------------------

    @advisory(nothing)
    async def remember(self, task_id: str, task: str, steps: Sequence[Step]) -> None:
        record = {
            "task_id": task_id,
            "task": task,
            "steps": [{"tool": s.tool, "arguments": s.arguments, "observation": s.observation} for s in steps],
        }
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        await anyio.to_thread.run_sync(self._append_run, line)

    def _append_run(self, line: str) -> None:
        self._runs.parent.mkdir(parents=True, exist_ok=True)
        with self._runs.open("a", encoding="utf-8") as handle:
            handle.write(line)

    async def report_outcome(self, task_id: str, success: bool, *, provenance: Provenance | None = None) -> bool:
        """Label a remembered run's task (and, on failure, nothing more: which step failed is unknown).

        Not advisory: whoever reports an outcome (the CLI, a client's tool call) is told when it was not stored.
        `provenance` says who reported it; none is the operator (the CLI).
        """
        record = await anyio.to_thread.run_sync(self._find_run, task_id)
        if record is None:
            return False
        origin = provenance or Provenance("outcome", reporter="operator", session=task_id)
        await self._label_task(record["task"], success, meta={"task_id": task_id}, provenance=origin)
        if success:
            steps = [Step(s["tool"], s["arguments"], "read", observation=s.get("observation")) for s in record["steps"]]
            if steps:
                await self._label_steps(steps, ["success"] * len(steps), source="outcome", provenance=origin)
        return True

    def _find_run(self, task_id: str) -> dict[str, Any] | None:
        if not self._runs.exists():
            return None
        found = None
        for line in self._runs.read_text(encoding="utf-8").splitlines()[-RUNS_KEPT:]:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("task_id") == task_id:
                found = record
        return found


def _stamped(provenance: Provenance | None, source: str) -> Provenance:
    """The provenance a new row is stored with: the one given, timed now if it was not."""
    if provenance is None:
        return Provenance.of(source)
    return provenance if provenance.at is not None else dataclasses.replace(provenance, at=time.time())
