"""Verdicts from a real small model: how many are readable, and how many tokens each one decodes.

    .venv/bin/python -m bench.verdicts [--reviews 24] [--max-tokens 256] [--timeout 300] [--url http://127.0.0.1:8089/v1]

Starts the local model (SmolLM2-135M-Instruct behind llama.cpp, `scripts/local_model.py`, one CPU
thread) unless `--url` names a running OpenAI-compatible server, and reviews realistic τ² retail
segments with the product's own reviewer (`StrongReviewer`: its prompt, its grammar-bound
verdict schema, its one retry) over the 16 retail tools and the retail policy. Each segment is
a read or two that ran on the repository's retail DB (find the user, look at the user or the
order) and a held write, some right and some wrong: cancel a pending order, cancel a delivered
one, return a delivered item, ship a pending order to the user's address, cancel another user's
order, hand over to a human. Each review is a session of its own; the tool definitions and
the policy before the segment are served from llama.cpp's prefix cache after the first.

Prints, per review: whether the verdict was read from the first answer, after the retry, or not
at all; the tokens decoded for it (the server's `usage.completion_tokens`, every attempt
together); its prompt and cached tokens. A review whose model fails (a timeout under load, an
error) is an unreadable verdict with no answer, as the proxy takes it (it fails closed), and the
run goes on. Then the readable rate and decode tokens p50 / p95.
What this measures is protocol, not quality: a 135M model's verdicts are poor, but each one
must be a verdict the proxy can act on, and a short one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from bench.measure import local_model, machine_line
from bench.tau2_retail import Db, ToolError, call_tool, data_dir, fresh_db, load_db
from bench.tau2_retail.server import definitions
from bench.tau2_retail.tools import error_text, render
from mcp_spec_proxy.config.schema import ProxyConfig
from mcp_spec_proxy.models import ChatModel, ModelConfig
from mcp_spec_proxy.review import ReviewFailed, ReviewRequest, Verdict
from mcp_spec_proxy.review.kinds import ReviewerKind
from mcp_spec_proxy.review.strong import StrongReviewer
from mcp_spec_proxy.tools.catalog import Catalog
from mcp_spec_proxy.tools.fingerprints import FingerprintStore
from mcp_spec_proxy.trajectory import History, Segment, Step

REPO = Path(__file__).resolve().parent.parent
SERVER = "retail"


def tool(name: str) -> str:
    return f"{SERVER}__{name}"


@dataclass(frozen=True)
class Case:
    kind: str
    reads: list[tuple[str, dict[str, Any]]]
    write: tuple[str, dict[str, Any]]
    intent: str


def cases(db: Db, count: int) -> Iterator[Case]:
    """`count` segments over the DB's users (in id order) that have a pending and a delivered order."""
    orders = db["orders"]
    users = [u for _, u in sorted(db["users"].items())]
    eligible = []
    for user in users:
        mine = [orders[o] for o in user["orders"] if o in orders]
        pending = [o for o in mine if o["status"] == "pending"]
        delivered = [o for o in mine if o["status"] == "delivered"]
        if pending and delivered:
            eligible.append((user, pending[0], delivered[0]))
    kinds = ["cancel pending", "cancel delivered", "return delivered", "ship to own address", "other's order", "human"]
    for n in range(count):
        user, pending, delivered = eligible[n // len(kinds) % len(eligible)]
        other = eligible[(n // len(kinds) + 1) % len(eligible)][1]
        uid, email = user["user_id"], user["email"]
        by_email = (tool("find_user_id_by_email"), {"email": email})
        kind = kinds[n % len(kinds)]
        if kind == "cancel pending":
            order = pending["order_id"]
            reads = [by_email, (tool("get_order_details"), {"order_id": order})]
            write = (tool("cancel_pending_order"), {"order_id": order, "reason": "no longer needed"})
            intent = f"The user ({email}) wants to cancel order {order}: they no longer need it."
        elif kind == "cancel delivered":
            order = delivered["order_id"]
            reads = [by_email, (tool("get_order_details"), {"order_id": order})]
            write = (tool("cancel_pending_order"), {"order_id": order, "reason": "ordered by mistake"})
            intent = f"The user ({email}) wants to cancel order {order}, ordered by mistake."
        elif kind == "return delivered":
            order = delivered["order_id"]
            name = user["name"]
            zip_code = user["address"]["zip"]
            find = {"first_name": name["first_name"], "last_name": name["last_name"], "zip": zip_code}
            reads = [(tool("find_user_id_by_name_zip"), find), (tool("get_order_details"), {"order_id": order})]
            item = delivered["items"][0]
            method = delivered["payment_history"][0]["payment_method_id"]
            write = (
                tool("return_delivered_order_items"),
                {"order_id": order, "item_ids": [item["item_id"]], "payment_method_id": method},
            )
            intent = f"The user wants to return the {item['name']} from order {order}, refunded to {method}."
        elif kind == "ship to own address":
            order = pending["order_id"]
            reads = [(tool("get_user_details"), {"user_id": uid}), (tool("get_order_details"), {"order_id": order})]
            write = (tool("modify_pending_order_address"), {"order_id": order, **user["address"]})
            intent = f"The user ({uid}) wants order {order} shipped to their default address."
        elif kind == "other's order":
            order = other["order_id"]
            reads = [by_email, (tool("get_order_details"), {"order_id": order})]
            write = (tool("cancel_pending_order"), {"order_id": order, "reason": "no longer needed"})
            intent = f"The user ({email}) wants to cancel order {order}."
        else:
            reads = [by_email]
            write = (tool("transfer_to_human_agents"), {"summary": f"User {uid} wants a refund outside the policy."})
            intent = f"The user ({email}) asks for a refund the policy does not allow; they want a person."
        yield Case(kind, reads, write, intent)


def run_reads(db: Db, reads: list[tuple[str, dict[str, Any]]]) -> list[Step]:
    steps = []
    for name, arguments in reads:
        try:
            observation, failed = render(call_tool(db, name.removeprefix(f"{SERVER}__"), arguments)), False
        except ToolError as exc:
            observation, failed = error_text(exc), True
        steps.append(Step(name, arguments, "read", observation=observation, is_error=failed))
    return steps


@dataclass(frozen=True)
class Seen:
    kind: str
    outcome: str  # "first answer", "after retry", "unreadable"
    accepted: bool
    decoded: int
    prompt: int
    cached: int
    seconds: float
    failure: str = ""  # the model failed (timed out, errored): no answer to read at all


class NoOne:
    """The user channel of a review that asks no one (the strong reviewer never does)."""

    async def confirm(self, message: str, schema: dict[str, Any]) -> dict[str, Any] | None:
        return None


def outcome(verdict: Verdict) -> str:
    if verdict.reviewer != ReviewerKind.STRONG.chain.text:  # "strong (unreadable)" when it was not
        return "unreadable"
    return "first answer" if len(verdict.model_calls) == 1 else "after retry"


async def measure(url: str, reviews: int, max_tokens: int, model_timeout_s: float = 300) -> list[Seen]:
    folder = data_dir(os.environ)
    db = load_db(folder / "db.json")
    policy = (folder / "policy.md").read_text(encoding="utf-8")
    config = ProxyConfig.model_validate({"servers": {SERVER: {"command": "unused"}}})
    catalog = Catalog(config, FingerprintStore(None))
    catalog.set_tools(SERVER, definitions())
    # As the real-model tests configure it (tests/test_real_model.py): greedy, with llama.cpp's
    # repetition samplers, which keep a 135M model from looping inside an open string.
    model = ChatModel(
        "strong",
        ModelConfig(
            base_url=url,
            model="smollm2-135m",
            max_retries=0,
            timeout=model_timeout_s,
            temperature=0,
            max_tokens=max_tokens,
            extra_body={"dry_multiplier": 0.8, "repeat_penalty": 1.2},
        ),
    )
    reviewer = StrongReviewer(model, catalog, policy)
    seen = []
    try:
        for n, case in enumerate(cases(db, reviews)):
            steps = run_reads(fresh_db(db), case.reads)
            name, arguments = case.write
            held = Step(name, arguments, "write", intent=case.intent)
            request = ReviewRequest(
                f"review-{n}", catalog.lookup(name), arguments, case.intent, Segment((*steps, held)), History()
            )
            started = time.perf_counter()
            try:
                verdict = await reviewer.review(request, NoOne())
            except ReviewFailed as exc:  # the proxy fails closed here: no verdict, and the next review goes on
                calls, found, accepted, failure = exc.calls, "unreadable", False, str(exc)
            else:
                calls, found, accepted, failure = verdict.model_calls, outcome(verdict), verdict.accepted, ""
            first = calls[0] if calls else None
            seen.append(
                Seen(
                    case.kind,
                    found,
                    accepted,
                    sum(c.completion_tokens for c in calls),
                    first.prompt_tokens if first else 0,
                    first.cached_tokens if first else 0,
                    time.perf_counter() - started,
                    failure,
                )
            )
            row = seen[-1]
            print(
                f"{n:3d} {case.kind:20s} {row.outcome:12s} accepted={row.accepted!s:5s} decoded={row.decoded:4d}"
                f" prompt={row.prompt:5d} cached={row.cached:5d} {row.seconds:6.1f}s"
                + (f" no answer: {row.failure}" if row.failure else ""),
                file=sys.stderr,
                flush=True,
            )
    finally:
        await model.aclose()
    return seen


def percentile(values: list[int], share: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reviews", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=256, help="max_tokens of a verdict (the retry gets twice)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds a verdict may take (then: no answer)")
    parser.add_argument("--url", help="a running OpenAI-compatible server (default: start the local model)")
    args = parser.parse_args()
    if args.url:
        seen = anyio.run(measure, args.url, args.reviews, args.max_tokens, args.timeout)
    else:
        with local_model() as url:
            seen = anyio.run(measure, url, args.reviews, args.max_tokens, args.timeout)
    print(machine_line())
    print(
        f"{len(seen)} reviews of τ² retail segments (16 tools, the retail policy); SmolLM2-135M, llama.cpp, 1 thread;"
        f" max_tokens {args.max_tokens}\n"
    )
    print(table(seen))


def table(seen: list[Seen]) -> str:
    """The summary row under its header: readable and unreadable (with those that got no answer), tokens, time."""
    total = len(seen)
    first = sum(s.outcome == "first answer" for s in seen)
    readable = sum(s.outcome != "unreadable" for s in seen)
    unanswered = sum(bool(s.failure) for s in seen)
    decoded = [s.decoded for s in seen]
    later = [s for s in seen[1:] if s.prompt]
    share = sum(s.cached for s in later) / max(1, sum(s.prompt for s in later))
    unreadable = f"{total - readable}/{total}" + (f" ({unanswered} no answer)" if unanswered else "")
    return "\n".join(
        [
            "| reviews | readable, first answer | readable after retry | unreadable | accepted |"
            " decode tokens p50 | p95 | max | prompt tokens p50 | cached share (after the first) | s per review p50 |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
            f"| {total} | {first}/{total} | {readable - first}/{total} | {unreadable} |"
            f" {sum(s.accepted for s in seen)}/{total} | {statistics.median(decoded):g} | {percentile(decoded, 0.95)} |"
            f" {max(decoded)} | {statistics.median(s.prompt for s in seen):g} | {share:.2f} |"
            f" {statistics.median(s.seconds for s in seen):.1f} |",
        ]
    )


if __name__ == "__main__":
    main()
