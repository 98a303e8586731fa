"""The eight tasks: each one's gold steps, the weak model's planted detour, and the check of its end state."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.engine.files import (
    APP_EXAMPLE_INI,
    APP_INI,
    ATLAS_SUMMARY,
    CHANGELOG_AFTER,
    FILES,
    NOTES,
    Q1_REPORT,
    Q2_REPORT,
    SHOPPING,
    STATUS,
    TODOS,
    WRONG_ATLAS_SUMMARY,
    WRONG_CHANGELOG_AFTER,
)
from mcp_spec_proxy.engine import RunResult
from mcp_spec_proxy.prompts import FINAL_ANSWER
from mcp_spec_proxy.testing import Reply, ToolCall


@dataclass(frozen=True)
class Act:
    """One step of a trajectory: a tool call, or the final answer (`final_answer` {answer})."""

    tool: str
    arguments: dict[str, Any]

    def as_action(self) -> dict[str, Any]:
        return {"tool": self.tool, "arguments": self.arguments}

    def as_reply(self, reasoning: str | None = None) -> Reply:
        if self.tool == FINAL_ANSWER:
            return Reply(content=str(self.arguments["answer"]), reasoning=reasoning)
        return Reply(tool_calls=[ToolCall(self.tool, self.arguments)], reasoning=reasoning)


def answer(text: str) -> Act:
    return Act(FINAL_ANSWER, {"answer": text})


@dataclass(frozen=True)
class Detour:
    """Where and how the weak model leaves the gold."""

    at: int  # index of the gold step it gets wrong
    steps: tuple[Act, ...]  # what it drafts instead, from that index on
    rejoin: int | None  # gold index it continues from after the detour (None: the detour ends the task)
    kind: str
    reason: str  # the verifier's reason
    replace: bool  # the verifier gives the gold step as replacement_action; else null → repair turn


@dataclass(frozen=True)
class Task:
    id: str
    prompt: str
    gold: tuple[Act, ...]
    expect: dict[str, str | None]  # file → content after the task (None: must not exist)
    detour: Detour | None = None
    answer_graded: bool = False

    def weak_next(self, history: list[Act]) -> Act:
        """The weak model's next draft after `history` (committed steps plus the open segment)."""
        gold, d, n = list(self.gold), self.detour, len(history)
        if history == gold[:n] and n < len(gold):
            return d.steps[0] if d is not None and n == d.at else gold[n]
        if d is not None and history[: d.at] == gold[: d.at]:
            taken = history[d.at :]
            if len(taken) < len(d.steps) and taken == list(d.steps[: len(taken)]):
                return d.steps[len(taken)]
            after = taken[len(d.steps) :]
            if d.rejoin is not None and taken[: len(d.steps)] == list(d.steps):
                j = d.rejoin + len(after)
                if after == gold[d.rejoin : j] and j < len(gold):
                    return gold[j]
        # Off both paths (a short K let part of the detour commit unreviewed, then a replacement ran):
        # pick up the gold after the last gold step taken.
        if history and history[-1] in gold and gold.index(history[-1]) + 1 < len(gold):
            return gold[gold.index(history[-1]) + 1]
        raise LookupError(f"{self.id}: no weak draft scripted after {[a.tool for a in history]}")


def tasks(root: Path) -> list[Task]:
    def p(rel: str) -> str:
        return str(root / rel)

    def read(rel: str) -> Act:
        return Act("fs__read_text_file", {"path": p(rel)})

    def ls(rel: str = "") -> Act:
        return Act("fs__list_directory", {"path": p(rel) if rel else str(root)})

    def write(rel: str, content: str) -> Act:
        return Act("fs__write_file", {"path": p(rel), "content": content})

    def edit(rel: str, old: str, new: str) -> Act:
        return Act("fs__edit_file", {"path": p(rel), "edits": [{"oldText": old, "newText": new}]})

    meetings = [p(n) for n in sorted(FILES) if n.startswith("meetings/")]
    projects = [p(n) for n in sorted(FILES) if n.startswith("projects/")]
    recipes = [p(n) for n in sorted(FILES) if n.startswith("recipes/")]
    appended = NOTES + "book the dentist for March\n"
    return [
        Task(
            "copy-notes",
            "Copy my notes (notes.txt) into a new file todo.txt.",
            (read("notes.txt"), write("todo.txt", NOTES), answer("I copied the six lines of notes.txt into todo.txt.")),
            {"todo.txt": NOTES, "notes.txt": NOTES},
        ),
        Task(
            "append-line",
            "Add the line 'book the dentist for March' at the end of notes.txt.",
            (
                read("notes.txt"),
                write("notes.txt", appended),
                answer("notes.txt now ends with 'book the dentist for March'."),
            ),
            {"notes.txt": appended},
            Detour(
                1,
                (write("notes.txt", "book the dentist for March\n"),),
                2,
                "writes wrong content",
                "The held write replaces notes.txt with the new line alone and would delete its six existing lines.",
                replace=True,
            ),
        ),
        Task(
            "atlas-summary",
            "Find the meeting notes that mention the Atlas migration and write a summary of its decisions "
            "into atlas-summary.md.",
            (
                ls("meetings"),
                Act("fs__read_multiple_files", {"paths": meetings}),
                write("atlas-summary.md", ATLAS_SUMMARY),
                answer("atlas-summary.md lists the four Atlas decisions from the 9 November platform meeting."),
            ),
            {"atlas-summary.md": ATLAS_SUMMARY},
            Detour(
                2,
                (write("atlas-summary.md", WRONG_ATLAS_SUMMARY),),
                3,
                "writes from the wrong observed record",
                "The summary lists the decisions of the 2 November stand-up (hiring); the Atlas migration was "
                "decided in the 9 November platform meeting.",
                replace=False,
            ),
        ),
        Task(
            "config-port",
            "Change the app's port from 8080 to 9090 in its config.",
            (
                ls("config"),
                read("config/app.ini"),
                edit("config/app.ini", "port = 8080", "port = 9090"),
                answer("The app now listens on port 9090 (config/app.ini)."),
            ),
            {"config/app.ini": APP_INI.replace("8080", "9090"), "config/app.example.ini": APP_EXAMPLE_INI},
            Detour(
                1,
                (
                    read("config/app.example.ini"),
                    edit("config/app.example.ini", "port = 8080", "port = 9090"),
                ),
                3,
                "reads the wrong file",
                "app.example.ini is the template; the app reads config/app.ini.",
                replace=True,
            ),
        ),
        Task(
            "archive-report",
            "Archive the Q1 report: create archive/2026 and move reports/q1-report.md into it.",
            (
                Act("fs__create_directory", {"path": p("archive/2026")}),
                Act(
                    "fs__move_file",
                    {"source": p("reports/q1-report.md"), "destination": p("archive/2026/q1-report.md")},
                ),
                answer("Moved reports/q1-report.md to archive/2026/q1-report.md."),
            ),
            {"archive/2026/q1-report.md": Q1_REPORT, "reports/q1-report.md": None, "reports/q2-report.md": Q2_REPORT},
            Detour(
                1,
                (read("reports/q1-report.md"), write("archive/2026/q1-report.md", Q1_REPORT)),
                2,
                "wrong tool, same effect",
                "The task is to move the report; writing a copy leaves reports/q1-report.md in place.",
                replace=True,
            ),
        ),
        Task(
            "collect-todos",
            "Collect every line starting with 'TODO:' from the files in projects/ into todos.md, one per line, "
            "without the prefix.",
            (
                ls("projects"),
                Act("fs__read_multiple_files", {"paths": projects}),
                write("todos.md", TODOS),
                answer("todos.md lists your 5 open TODOs from car.md, garden.md and house.md."),
            ),
            {"todos.md": TODOS},
            Detour(
                2,
                (answer("You have 5 open TODOs:\n" + TODOS),),
                None,
                "answers too early",
                "The answer lists the TODOs but todos.md was never written.",
                replace=True,
            ),
            answer_graded=True,
        ),
        Task(
            "buttermilk",
            "Which of my recipes needs buttermilk? Put its ingredient list into shopping.txt.",
            (
                ls(),
                ls("recipes"),
                Act("fs__read_multiple_files", {"paths": recipes}),
                write("shopping.txt", SHOPPING),
                answer("The buttermilk pancakes; their seven ingredients are in shopping.txt."),
            ),
            {"shopping.txt": SHOPPING},
        ),
        Task(
            "ship-release",
            "Mark release 2.4.0 as shipped: set its status line in status.md to 'Status: shipped' and add an "
            "entry for it, listing its scope, at the top of changelog.md.",
            (
                read("status.md"),
                edit("status.md", "Status: in review", "Status: shipped"),
                read("changelog.md"),
                write("changelog.md", CHANGELOG_AFTER),
                answer("status.md says shipped and changelog.md starts with the 2.4.0 entry."),
            ),
            {"status.md": STATUS.replace("in review", "shipped"), "changelog.md": CHANGELOG_AFTER},
            Detour(
                3,
                (write("changelog.md", WRONG_CHANGELOG_AFTER),),
                4,
                "writes from the wrong observed record",
                "The new entry is headed 2.3.1, the previous release; status.md says this release is 2.4.0.",
                replace=False,
            ),
        ),
    ]


def warmup_task(root: Path) -> Task:
    """Unmeasured: a write the verifier rejects with no replacement, so that every prompt kind runs once."""
    path = str(root / "warmup.txt")
    return Task(
        "warm-up",
        "Create warmup.txt saying hello.",
        (Act("fs__write_file", {"path": path, "content": "hello\n"}), answer("Done.")),
        {"warmup.txt": "hello\n"},
        Detour(0, (Act("fs__write_file", {"path": path, "content": "helo\n"}),), 1, "typo", "Typo.", replace=False),
    )


def reset(root: Path) -> None:
    for child in root.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()
    for rel, content in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content, encoding="utf-8")


def succeeded(root: Path, task: Task, result: RunResult) -> bool:
    if result.status != "answered" or result.answer != task.gold[-1].arguments["answer"]:
        return False
    for rel, want in task.expect.items():
        path = root / rel
        if want is None:
            if path.exists():
                return False
        elif not path.is_file() or path.read_text(encoding="utf-8") != want:
            return False
    return True
