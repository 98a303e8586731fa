"""After the run: the barrier's promises checked against the audit log, the telemetry and the files."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.load.plan import Call, Plan
from bench.load.sessions import Level


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Evidence:
    """What the checks read: the audit log, the telemetry, what the clients did, what the model served."""

    audit: list[dict[str, Any]]
    telemetry: list[dict[str, Any]]
    issued: list[Call]  # every write a client sent, answered or not
    plans: list[Plan]
    model_verifications: int

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.audit if e["event"] == kind]


def check_promises(evidence: Evidence, levels: list[Level]) -> list[Check]:
    errors = sum(len(level.errors) for level in levels)
    return [
        Check("every call answered without error", errors == 0, f"{errors} errors"),
        check_order(evidence),
        check_forwarded_once(evidence),
        check_writes_issued(evidence),
        check_files(evidence),
        check_verdicts_audited(evidence),
    ]


def check_order(evidence: Evidence) -> Check:
    by_call: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in evidence.audit:
        if "call" in event:  # a write's held/verdict/forwarded; a read's audit line has no call id
            by_call[event["call"]].append(event)
    bad = []
    for call_id, events in by_call.items():
        kinds = [e["event"] for e in events]
        if kinds != ["held", "verdict", "forwarded"] or events[1].get("accepted") is not True:
            bad.append(f"{call_id}: {kinds}")
    detail = f"{len(by_call) - len(bad)} of {len(by_call)} call ids" + (f"; first wrong: {bad[:3]}" if bad else "")
    return Check(
        "each call id: held -> verdict(accepted) -> forwarded, in that order", bool(by_call) and not bad, detail
    )


def check_forwarded_once(evidence: Evidence) -> Check:
    verdicts = {v["call"] for v in evidence.events("verdict")}
    forwarded = Counter(e["call"] for e in evidence.events("forwarded"))
    twice = [c for c, n in forwarded.items() if n > 1]
    without = [c for c in forwarded if c not in verdicts]
    never = [c for c in verdicts if forwarded[c] == 0]
    detail = f"{len(verdicts)} verdicts, {forwarded.total()} forwarded"
    detail += f"; forwarded more than once: {twice[:3]}" if twice else ""
    detail += f"; forwarded without a verdict: {without[:3]}" if without else ""
    detail += f"; verdict never forwarded: {never[:3]}" if never else ""
    return Check("exactly one forwarded per verdict, none without one", not (twice or without or never), detail)


def check_writes_issued(evidence: Evidence) -> Check:
    """Each write a client sent is held once under its own (unique) arguments, and has its verdict."""
    held = Counter((e["tool"], e["arguments_digest"]) for e in evidence.events("held"))
    sent = Counter((call.tool, call.forwarded_digest()) for call in evidence.issued)
    verdicts = len(evidence.events("verdict"))
    detail = f"{len(evidence.issued)} writes issued, {held.total()} held, {verdicts} verdicts"
    if held != sent:
        detail += f"; {(sent - held).total()} sent but not held, {(held - sent).total()} held but not sent"
    return Check(
        "verdicts = writes issued, each held under its own arguments",
        held == sent and verdicts == len(evidence.issued),
        detail,
    )


def check_files(evidence: Evidence) -> Check:
    wrong, files = [], 0
    for p in evidence.plans:
        writes = [c for c in p.calls if c.tool == "fs__write_file"]
        if not writes:
            continue
        files += 1
        path = Path(writes[-1].arguments["path"])
        content = path.read_text() if path.exists() else None
        if content != writes[-1].arguments["content"]:
            wrong.append(f"{path.name}: {content!r:.60}")
    detail = f"{files - len(wrong)} of {files} files" + (f"; wrong: {wrong[:3]}" if wrong else "")
    return Check("each per-session file holds its last write's content", files > 0 and not wrong, detail)


def check_verdicts_audited(evidence: Evidence) -> Check:
    """Every verdict the model gave, and every decision in telemetry, has its audited verdict."""
    verdicts = evidence.events("verdict")
    audited = {v["call"] for v in verdicts}
    decisions = [e for e in evidence.telemetry if e.get("kind") == "decision"]
    missing = [d["call"] for d in decisions if d["call"] not in audited]
    by_model = sum(1 for v in verdicts if v.get("decided_by") == "strong")
    ok = not missing and len(decisions) == len(verdicts) and evidence.model_verifications == by_model == len(verdicts)
    detail = (
        f"{evidence.model_verifications} verdicts served by the model, {len(decisions)} decisions in telemetry, "
        f"{len(verdicts)} verdicts audited ({by_model} decided by strong)"
    )
    detail += f"; not audited: {missing[:3]}" if missing else ""
    return Check("every verdict is in the audit log", ok, detail)


def memory_info(plans: list[Plan], memory_file: Path) -> str:
    """Not a proxy promise: the memory server's create_entities is an unlocked read-modify-write."""
    names: set[str] = set()
    if memory_file.exists():
        for line in memory_file.read_text().splitlines():
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                continue
            if item.get("type") == "entity":
                names.add(item["name"])
    created = [
        entity["name"]
        for p in plans
        for c in p.calls
        if c.tool == "memory__create_entities"
        for entity in c.arguments["entities"]
    ]
    lost = [name for name in created if name not in names]
    text = f"memory graph: {len(names)} entities on disk; {len(created) - len(lost)} of {len(created)} created present"
    if lost:
        text += (
            f" (missing: {', '.join(lost[:4])}{' ...' if len(lost) > 4 else ''}). server-memory's create_entities"
            " loads, extends and rewrites its whole file without a lock, so concurrent calls can overwrite each"
            " other after the proxy forwarded them"
        )
    return text


def attribute_model_calls(levels: list[Level], telemetry: list[dict[str, Any]]) -> None:
    """Levels run one after another, so their decisions follow each other in the telemetry."""
    decisions = iter([e for e in telemetry if e.get("kind") == "decision"])
    for level in levels:
        for decision in itertools.islice(decisions, len(level.writes_issued)):
            level.model_ms += [call["latency_ms"] for call in decision.get("model_calls", [])]


def proxy_log_problems(log: Path) -> list[str]:
    """Each WARNING or ERROR record of the proxy's log: its first line, and its last if it has more."""
    records: list[list[str]] = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        if line[:4].isdigit() or not records:  # a record starts with its timestamp
            records.append([line])
        else:
            records[-1].append(line)
    problems = [[line for line in r if line.strip()] for r in records if " ERROR " in r[0] or " WARNING " in r[0]]
    return [r[0] if len(r) == 1 else f"{r[0]} ... {r[-1].strip()}" for r in problems]
