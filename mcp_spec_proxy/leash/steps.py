"""How LEASH sees a step: its one view (the call), and the rows a judged draft gives a hidden-state bank."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mcp_spec_proxy.leash.bank import Label
from mcp_spec_proxy.leash.encoders import HiddenStateEncoder, StepView
from mcp_spec_proxy.trajectory import Step


def view(step: Step) -> StepView:
    """LEASH's one representation of a step, the same when it is labelled, looked up and calibrated on.

    It is the call (tool and arguments) and never the step's own observation: a step is judged before
    it runs (a drafted read at `drafted`, a held write at the gate and at `review: leash`), when there is
    no observation of it yet, so a label that carried one would be a point no lookup can ever land on.
    The context before the call is not added for the text encoders: an MCP client sends no conversation
    and an imported or held-out example carries none, so it could not be the same at all three; a hidden
    state returned with the drafting call already is a function of that context (the drafting prompt).
    """
    return StepView(step.tool, step.arguments)


@dataclass(frozen=True)
class Row:
    """One labelled vector on its way into a bank."""

    vector: np.ndarray
    label: Label
    metadata: dict[str, Any]


def drafted_rows(
    encoder: HiddenStateEncoder, steps: Sequence[Step], labels: Sequence[Label], hidden: Sequence[Any] | None
) -> tuple[list[Row], int]:
    """The rows that judged drafted steps give a hidden-state bank, and how many calls gave none.

    A call with a state of its own (`call`) is one row. A turn whose calls share one state (`turn`:
    SGLang's chat API cannot tell them apart) is one row when every judged call of it got the same
    label; otherwise only the call whose own state it is (the turn's last) is stored — never one
    point under two opposite labels.
    """
    rows: list[Row] = []
    turns: dict[str, list[tuple[Step, Label]]] = {}
    for index, (step, label) in enumerate(zip(steps, labels, strict=True)):
        if step.state is not None:
            turns.setdefault(step.state.turn, []).append((step, label))
            continue
        given = hidden[index] if hidden else None
        vector = encoder.from_hidden(given, step=view(step)) if given is not None else encoder.recall(view(step))
        if vector is not None:
            rows.append(Row(vector, label, {"tool": step.tool, "representation": "call"}))
    skipped = 0
    for members in turns.values():
        own = [(s, label) for s, label in members if s.state is not None and s.state.representation == "call"]
        if len(own) == len(members) or len({label for _, label in members}) > 1:
            skipped += len(members) - len(own)
            for s, label in own:
                assert s.state is not None
                rows.append(Row(encoder.from_hidden(s.state.vector), label, {"tool": s.tool, "representation": "call"}))
            continue
        first, label = members[0]
        assert first.state is not None
        tools = [s.tool for s, _ in members]
        rows.append(
            Row(
                encoder.from_hidden(first.state.vector),
                label,
                {"tool": tools[-1], "tools": tools, "representation": "turn"},
            )
        )
    return rows, skipped


__all__ = ["Row", "drafted_rows", "view"]
